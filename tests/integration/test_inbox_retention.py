"""The inbox against real databases: ids count per kind and tenant (rows written before that count for
every kind and tenant), and a consumer's pruner forgets its own ids past the retention and not before,
in batches, leaving another consumer's alone."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select

from services.runtime.ledger_pruning import Pruner
from shared.ledger import inbox, intake
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import EarlyRelease, InboxMessage

NOW = 1_800_000_000.0
RETENTION = 3600.0


def at(seconds_ago: float) -> datetime:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC)


async def test_ids_count_per_kind_and_tenant(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    try:
        async with sessions(engine)() as session, session.begin():
            await inbox.record(session, "allocator", [inbox.Key("submit", "a", "X")], at(0))
            session.add(InboxMessage(consumer="allocator", message_id="old", processed_at=at(0)))  # before 0011
        async with sessions(engine)() as session:
            asked = [inbox.Key(kind, tenant, message_id) for kind in ("submit", "release") for tenant in ("a", "b")
                     for message_id in ("X", "old")]
            found = await inbox.seen(session, "allocator", asked)
            assert found == {inbox.Key("submit", "a", "X"), *(k for k in asked if k.message_id == "old")}
            assert await inbox.seen(session, "notifier", asked) == set()
    finally:
        await engine.dispose()


async def test_recording_the_unseen_ids_returns_them_and_counts_legacy_rows_as_seen(ledger_url: str) -> None:
    """`record_unseen` (one statement on PostgreSQL) answers as `seen` then `record` did."""
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    try:
        async with sessions(engine)() as session, session.begin():
            await inbox.record(session, "allocator", [inbox.Key("submit", "a", "X")], at(0))
            session.add(InboxMessage(consumer="allocator", message_id="old", processed_at=at(0)))  # before 0011
        asked = [inbox.Key(kind, tenant, message_id) for kind in ("submit", "release") for tenant in ("a", "b")
                 for message_id in ("X", "old", "new")]
        async with sessions(engine)() as session, session.begin():
            recorded = await inbox.record_unseen(session, "allocator", [*asked, *asked], at(0))
        assert recorded == {k for k in asked if k.message_id == "new" or (k.message_id == "X" and k != asked[0])}
        async with sessions(engine)() as session, session.begin():
            assert await inbox.record_unseen(session, "allocator", asked, at(0)) == set()
            assert await inbox.seen(session, "allocator", asked) == set(asked)
            assert await inbox.record_unseen(session, "notifier", asked[:1], at(0)) == set(asked[:1])
            assert await inbox.record_unseen(session, "allocator", [], at(0)) == set()
    finally:
        await engine.dispose()


async def test_a_pruner_forgets_its_consumers_ids_past_the_retention_and_not_before(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    try:
        async with sessions(engine)() as session, session.begin():
            for consumer in ("allocator", "notifier"):
                for i in range(25):  # each its own time: what a batch takes is exact
                    await inbox.record(session, consumer, [inbox.Key("status", "", f"old-{i}")], at(RETENTION + 1 + i))
                await inbox.record(session, consumer, [inbox.Key("status", "", "young")], at(RETENTION - 1))
            session.add(EarlyRelease(tenant="t", name="old", released_seq=1, released_at=at(RETENTION + 1)))
            session.add(EarlyRelease(tenant="t", name="young", released_seq=2, released_at=at(RETENTION - 1)))

        pruner = Pruner(sessions(engine), [inbox.pruning("notifier"), intake.prune_early_releases], RETENTION,
                        lambda: NOW, interval=0.0, batch=10, behind_pause=0.0)
        for _ in range(4):  # 25 old ids in batches of 10: the last pass finds none
            await pruner.run_if_due()
        assert pruner.passes == 4 and pruner.pruned == 26
        async with sessions(engine)() as session:
            kept = {(r.consumer, r.message_id) for r in await session.scalars(select(InboxMessage))}
            remembered = set(await session.scalars(select(EarlyRelease.name)))
        assert kept == {("notifier", "young"), ("allocator", "young"), *(("allocator", f"old-{i}") for i in range(25))}
        assert remembered == {"young"}
    finally:
        await engine.dispose()
