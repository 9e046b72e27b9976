"""The allocator's queue read from the ledger: what a cache kept from earlier cycles gives back is what
a fresh read gives, as claims come, are answered, allocated, preempted and placed elsewhere between two
reads, preempted back to the queue and released."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import delete, event, select

from shared.admission.model import QueueChanges, Running, Waiting
from shared.dra.results import Allocation, Decision, DeviceResult, State
from shared.ledger.decisions import claim_rows, release_devices
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.queue import Queue, QueueCache, load_queue
from shared.ledger.schema import Claim
from shared.ledger.unit_of_work import UnitOfWork, unit_of_work
from tests.builders import a_claim


def _spec(name: str, tenant: str) -> dict[str, Any]:
    claim = a_claim(name, tenant).request().build()
    return json.loads(claim.model_dump_json(by_alias=True, exclude_none=True))


def _allocation(device: str) -> Allocation:
    return Allocation("n1", (DeviceResult("gpu", "gpu.nvidia.com", "n1", device),))


async def _find(work: UnitOfWork, name: str) -> Claim | None:
    return await work.session.scalar(select(Claim).where(Claim.namespace == "t", Claim.name == name))


def _seen(queue: Queue) -> tuple[dict[Any, Any], dict[Any, Any]]:
    def w(x: Waiting) -> Any:
        return (x.tenant, x.name, x.claim, x.priority, x.preemptible, x.arrival, x.answered, x.displaced_by)

    def r(x: Running) -> Any:
        return (x.tenant, x.name, x.allocation, x.priority, x.preemptible, x.arrival, x.allocated_order)

    return {k: w(v) for k, v in queue.waiting.items()}, {k: r(v) for k, v in queue.running.items()}


async def test_a_cached_read_equals_a_fresh_one(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    make = sessions(engine)
    cache = QueueCache()

    async def check() -> Queue:
        async with unit_of_work(make) as work:
            cached = await load_queue(work, cache)
            fresh = await load_queue(work)
        assert _seen(cached) == _seen(fresh)
        return cached

    try:
        async with make() as session, session.begin():
            for i in range(3):
                session.add(Claim(namespace="t", name=f"c{i}", state=State.PENDING.value, spec=_spec(f"c{i}", "t"),
                                  priority=i, sequence=0, arrival=i + 1))
        first = await check()
        assert sorted(first.waiting) == [("t", "c0"), ("t", "c1"), ("t", "c2")] and not first.running
        async with unit_of_work(make) as work:  # c0 allocated, c1 answered
            rows = await claim_rows(work, first, [("t", "c0"), ("t", "c1")])
            work.writes.decision(rows[("t", "c0")], Decision(State.ALLOCATED, _allocation("gpu-0")))
            work.writes.status(rows[("t", "c0")])
            rows[("t", "c1")].reason = "waits"
            work.writes.status(rows[("t", "c1")])
        second = await check()
        assert second.running[("t", "c0")].allocation == _allocation("gpu-0")
        assert second.waiting[("t", "c1")].answered and not second.waiting[("t", "c2")].answered
        async with unit_of_work(make) as work:  # c0 preempted, then placed elsewhere at once
            row = (await claim_rows(work, second, [("t", "c0")]))[("t", "c0")]
            await release_devices(work, [row.id])
            row.state, row.allocation, row.node, row.reason = State.PENDING.value, None, None, None
            work.writes.status(row)
            work.writes.decision(row, Decision(State.ALLOCATED, _allocation("gpu-1")))
            work.writes.status(row)
        third = await check()
        assert third.running[("t", "c0")].allocation == _allocation("gpu-1")  # read again: its sequence moved
        async with unit_of_work(make) as work:  # c0 preempted back to the queue, c2 released
            rows = await claim_rows(work, third, [("t", "c0"), ("t", "c2")])
            await release_devices(work, [rows[("t", "c0")].id])
            rows[("t", "c0")].state, rows[("t", "c0")].allocation = State.PENDING.value, None
            work.writes.status(rows[("t", "c0")])
            rows[("t", "c2")].state, rows[("t", "c2")].reason = State.RELEASED.value, "released by the tenant"
            work.writes.status(rows[("t", "c2")])
        fourth = await check()
        assert sorted(fourth.waiting) == [("t", "c0"), ("t", "c1")] and not fourth.running
    finally:
        await engine.dispose()



async def test_a_decision_transaction_reads_only_the_claims_written_since_the_last(ledger_url: str) -> None:
    """In decision transactions (the shard's lock taken) a kept cache reads only the claim rows written
    since its last read, including the rows its own transaction wrote after that read and rows written
    outside any decision transaction, and still equals a full read; a transaction that rolls back takes
    what it read with it once the cache is invalidated."""
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    make = sessions(engine)
    cache = QueueCache(count_every=0.0)  # each read checked against a count (the default: every second)
    changes: list[QueueChanges] = []

    async def decide(before: Any = None, after: Any = None, *, commit: bool = True) -> Queue:
        """One decision transaction: `before` writes, the read (checked against a full one), `after` writes."""
        try:
            async with unit_of_work(make) as work:
                await work.take_turn("default", "test", 0.0)
                if before is not None:
                    await before(work)
                    await work.session.flush()
                queue = await load_queue(work, cache)
                fresh = await load_queue(work)
                assert _seen(queue) == _seen(fresh)
                changes.append(queue.waiting.snapshot()[1])  # what the cycle would be handed
                if after is not None:
                    await after(work, queue)
                if not commit:
                    raise _RolledBack
        except _RolledBack:
            cache.invalidate()  # as the allocator does when its transaction does not commit
        return queue

    def add(*names: str) -> Any:
        async def write(work: UnitOfWork) -> None:
            for name in names:
                work.session.add(Claim(namespace="t", name=name, state=State.PENDING.value, spec=_spec(name, "t"),
                                  sequence=0, arrival=int(name[1:]) + 1))
        return write

    try:
        first = await decide(add(*(f"c{i}" for i in range(40))))
        assert len(first.waiting) == 40 and cache.rows_read == 40

        async def allocate_c0_answer_c1(work: UnitOfWork, queue: Queue) -> None:
            rows = await claim_rows(work, queue, [("t", "c0"), ("t", "c1")])
            work.writes.decision(rows[("t", "c0")], Decision(State.ALLOCATED, _allocation("gpu-0")))
            work.writes.status(rows[("t", "c0")])
            rows[("t", "c1")].reason = "waits"
            work.writes.status(rows[("t", "c1")])

        await decide(after=allocate_c0_answer_c1)  # written after the read, in the same transaction
        third = await decide()
        assert cache.rows_read == 2 and ("t", "c0") in third.running and third.waiting[("t", "c1")].answered
        # the waiting claims hand on what changed: c0 went (allocated), c1 was rebuilt (answered)
        assert [w.name for w in changes[-1].went] == ["c0", "c1"] and changes[-1].came == (third.waiting[("t", "c1")],)
        assert changes[-1].since == changes[-2].version and not changes[-2].came and not changes[-2].went

        async def release_c0(work: UnitOfWork) -> None:
            row = await _find(work, "c0")
            assert row is not None
            await release_devices(work, [row.id])
            row.state, row.allocation, row.node = State.RELEASED.value, None, None
            work.writes.status(row)
            await add("c40")(work)

        fourth = await decide(release_c0)
        assert cache.rows_read == 2 and ("t", "c0") not in fourth.running and ("t", "c40") in fourth.waiting

        async with unit_of_work(make) as work:  # outside a decision transaction
            row = await _find(work, "c2")
            assert row is not None
            row.priority = 7
        read = []
        for _ in range(3):  # read, stamped with the reading transaction's revision, so read once more
            assert (await decide()).waiting[("t", "c2")].priority == 7
            read.append(cache.rows_read)
        assert read == [3, 1, 0]  # first with c0 and c40, which the last transaction wrote

        async def answer_c3(work: UnitOfWork) -> None:
            row = await _find(work, "c3")
            assert row is not None
            row.reason = "waits"
            work.writes.status(row)

        assert (await decide(answer_c3, commit=False)).waiting[("t", "c3")].answered
        after_rollback = await decide()
        assert not after_rollback.waiting[("t", "c3")].answered and cache.rows_read == 40

        async with make() as session, session.begin():  # a queued claim deleted behind the allocator's back
            await session.execute(delete(Claim).where(Claim.name == "c5"))
        checked = await decide()  # the count of queued rows differs: read in full
        assert ("t", "c5") not in checked.waiting and cache.rows_read == 39
    finally:
        await engine.dispose()


class _RolledBack(Exception):
    pass


async def test_the_kept_read_searches_the_revision_index_on_sqlite(tmp_path: Any) -> None:
    """SQLite, asked to order the rows written since a revision by id, scans the whole claims table in id
    order instead of searching the revision index: a deep queue's every row read for a few changed ones."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(url)
    engine = create_engine(url)
    make = sessions(engine)
    cache = QueueCache()
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    try:
        for n in range(2):  # a full read, then a kept one
            async with unit_of_work(make) as work:
                await work.take_turn("default", "test", 0.0)
                work.session.add(Claim(namespace="t", name=f"c{n}", state=State.PENDING.value,
                                       spec=_spec("c", "t"), sequence=0))
                await work.session.flush()
                event.listen(engine.sync_engine, "before_cursor_execute", record)
                await load_queue(work, cache)
                event.remove(engine.sync_engine, "before_cursor_execute", record)
        since = [(s, p) for s, p in statements if "claims.revision >" in s]
        assert len(since) == 1
        async with engine.connect() as connection:
            plan = [row[-1] for row in await connection.exec_driver_sql("EXPLAIN QUERY PLAN " + since[0][0],
                                                                        since[0][1])]
        assert plan and all("ix_claims_revision" in step for step in plan if "claims" in step), plan
    finally:
        await engine.dispose()
