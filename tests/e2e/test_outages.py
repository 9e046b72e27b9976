"""Services stay up through outages: NATS restarted under a running allocator and notifier, and
publishes that fail for a while; nothing exits, and what was decided reaches its subscribers after."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import select

from services.allocator import outbox_relay
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.runtime.stack import running_stack
from shared.contract import events, subjects
from shared.settings import BrokerSettings
from tests.e2e.helpers import alerts, failing_first, free_port, statuses
from tests.e2e.test_allocator_semantics import SLICE, broker, claim, submit
from tests.private_postgres import PrivatePostgres

pytestmark = pytest.mark.e2e



async def test_the_allocator_stays_up_through_a_nats_restart(ledger_url: str, tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats", port=free_port())
    server.start()
    try:
        async with broker(server, ledger_url, tmp_path) as b:
            allocator = await b.start_allocator()
            nc = await connect(b.url, name="tenant")
            seen = await statuses(nc)
            await submit(nc, claim("before"), "id-before")
            await seen.wait_for(lambda: ("team", "before") in seen.latest())

            server.stop()
            for _ in range(200):  # a fetch while nats-py reconnects only times out: still an outage
                if allocator.nats_outage.since is not None:
                    break
                await asyncio.sleep(0.05)
            assert (allocator.not_ready() or "").startswith("NATS unreachable"), allocator.not_ready()
            server.start()

            await submit(nc, claim("after"), "id-after")
            await seen.wait_for(lambda: ("team", "after") in seen.latest(), timeout=30)
            assert seen.latest()[("team", "after")]["state"] == "Allocated"
            assert not b.tasks[allocator].done()
            await nc.close()
    finally:
        server.stop()


async def test_statuses_that_could_not_be_published_are_published_later(
        nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing, failures = failing_first(outbox_relay.publish_pipelined, 3, ConnectionError("NATS is restarting"))
    monkeypatch.setattr(outbox_relay, "publish_pipelined", failing)
    async with broker(nats_server, ledger_url, tmp_path) as b:
        allocator = await b.start_allocator()
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        await submit(nc, claim("a"), "id-a")
        await seen.wait_for(lambda: ("team", "a") in seen.latest(), timeout=20)
        assert failures == [0] and not b.tasks[allocator].done()
        await nc.close()


async def test_the_allocator_stays_up_when_postgresql_drops_its_connections(
        nats_server: EmbeddedNats, postgres_url: str, tmp_path: Path) -> None:
    """Every backend of the ledger's database terminated under a running allocator (what a PostgreSQL
    restart does to its connections): it goes on, and the next claim is Allocated."""
    import asyncpg

    async with broker(nats_server, postgres_url, tmp_path) as b:
        allocator = await b.start_allocator()
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        await submit(nc, claim("before"), "id-before")
        await seen.wait_for(lambda: ("team", "before") in seen.latest())

        database = postgres_url.rsplit("/", 1)[1]
        admin = await asyncpg.connect(postgres_url.rsplit("/", 1)[0].replace("postgresql://", "postgres://")
                                      + "/postgres")
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1", database)
        finally:
            await admin.close()
        assert killed >= 1

        await submit(nc, claim("after"), "id-after")
        await seen.wait_for(lambda: ("team", "after") in seen.latest(), timeout=30)
        assert seen.latest()[("team", "after")]["state"] == "Allocated"
        assert not b.tasks[allocator].done()
        await nc.close()


async def test_the_stack_stays_up_through_a_postgresql_restart(
        nats_server: EmbeddedNats, private_postgres: PrivatePostgres, tmp_path: Path) -> None:
    """PostgreSQL itself stopped under the running watcher, allocator and notifier and started again: a
    claim submitted while it is down is Allocated once it is back, the allocator says it was degraded and
    that it recovered, and no service exits."""
    inventory = tmp_path / "slices.yaml"
    inventory.write_text(SLICE)
    settings = BrokerSettings(nats_url=nats_server.url, db=private_postgres.url, data_dir=tmp_path / "data",
                              inventory=[inventory])
    async with running_stack(settings, services=("watcher", "allocator", "notifier")) as stack:
        assert stack.allocator is not None and await stack.allocator.wait_for_inventory(20)
        nc = await connect(stack.nats_url, name="tenant")
        seen, alarms = await statuses(nc), await alerts(nc)
        await submit(nc, claim("before"), "id-before")
        await seen.wait_for(lambda: ("team", "before") in seen.latest())

        def degraded(service: str, resolved: bool) -> bool:
            return any(a["kind"] == "service-degraded" and a["labels"] == {"service": service}
                       and a["resolved"] is resolved for _, a in alarms.messages)

        await asyncio.to_thread(private_postgres.stop)
        await submit(nc, claim("during"), "id-during")  # the allocator fails to commit it, and keeps trying
        status = events.claim_status(namespace="team", name="other", state="Pending", allocation=None,
                                     reason="waits", sequence=1)  # the notifier fails to record it
        await publish_json(nc.jetstream(), subjects.status("team", "other"), status, msg_id="status-other")
        await alarms.wait_for(lambda: degraded("allocator", False) and degraded("notifier", False), timeout=30)
        await asyncio.to_thread(private_postgres.start)

        await seen.wait_for(lambda: ("team", "during") in seen.latest(), timeout=30)
        assert seen.latest()[("team", "during")]["state"] == "Allocated"
        await alarms.wait_for(lambda: degraded("allocator", True) and degraded("notifier", True), timeout=30)
        assert not [name for name, task in stack.tasks.items() if task.done()]
        await nc.close()


async def test_a_long_ledger_outage_spends_no_deliveries(
        nats_server: EmbeddedNats, private_postgres: PrivatePostgres, tmp_path: Path) -> None:
    """PostgreSQL down for longer than max_deliver redeliveries would last: the allocator holds its batch
    in progress and tries it again, instead of nak-ing it until JetStream gives up on the claim."""
    async with broker(nats_server, private_postgres.url, tmp_path) as b:
        allocator = await b.start_allocator(max_deliver=2)
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        await asyncio.to_thread(private_postgres.stop)
        await submit(nc, claim("waits-out"), "id-waits-out")
        for _ in range(600):  # until it has failed several times, longer than two deliveries would last
            if allocator.ledger_outage.wait >= 1.6:
                break
            await asyncio.sleep(0.05)
        assert allocator.ledger_outage.since is not None and allocator.not_ready() is not None
        await asyncio.to_thread(private_postgres.start)
        await seen.wait_for(lambda: ("team", "waits-out") in seen.latest(), timeout=30)
        assert seen.latest()[("team", "waits-out")]["state"] == "Allocated"
        assert allocator.ledger_outage.since is None
        await nc.close()


async def test_a_status_batch_that_fails_once_still_raises_its_alert_once(
        nats_server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notifier's transaction fails after the alert book took the statuses in: rebuilt from the ledger
    before they are tried again, the Rejected claim's alert is raised, recorded and sent once (applied twice
    to the same book, the repeat folded into nothing and was never sent)."""
    from shared.ledger import alerts as alert_history
    from shared.ledger.engine import sessions
    from shared.ledger.schema import AlertRecord

    failing_once, failures = failing_first(alert_history.record, 1,
                                           ConnectionError("the ledger went away mid-transaction"))
    monkeypatch.setattr(alert_history, "record", failing_once)
    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data")
    async with running_stack(settings, services=("notifier",)) as stack:
        nc = await connect(stack.nats_url, name="test")
        alarms = await alerts(nc)
        rejected = events.claim_status(namespace="team", name="typo", state="Rejected", allocation=None,
                                       reason="CEL compile error", sequence=1)
        other = events.claim_status(namespace="team", name="fine", state="Pending", allocation=None,
                                    reason="waits", sequence=1)
        js = nc.jetstream()
        await publish_json(js, subjects.status("team", "typo"), rejected, msg_id="s-typo")
        await publish_json(js, subjects.status("team", "fine"), other, msg_id="s-fine")
        await alarms.wait_for(lambda: any(a["kind"] == "claim-rejected" for _, a in alarms.messages), timeout=20)
        assert failures == [0]
        async with sessions(stack.engine)() as session:
            rows = list(await session.scalars(select(AlertRecord).where(AlertRecord.kind == "claim-rejected")))
        assert len(rows) == 1 and not rows[0].resolved
        assert [a["kind"] for _, a in alarms.messages].count("claim-rejected") == 1
        await nc.close()
