"""The allocator's queue read from the ledger: what a cache kept from earlier cycles gives back is what
a fresh read gives, as claims come, are answered, allocated, preempted and placed elsewhere between two
reads, preempted back to the queue and released."""

from __future__ import annotations

import json
from typing import Any

from services.allocator import ledger_ops as ops
from shared.admission import Running, Waiting
from shared.allocation import Allocation, Decision, DeviceResult, State
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import Claim
from tests.builders import a_claim


def _spec(name: str, tenant: str) -> dict[str, Any]:
    claim = a_claim(name, tenant).request().build()
    return json.loads(claim.model_dump_json(by_alias=True, exclude_none=True))


def _allocation(device: str) -> Allocation:
    return Allocation("n1", (DeviceResult("gpu", "gpu.nvidia.com", "n1", device),))


def _seen(queue: ops.Queue) -> tuple[dict[Any, Any], dict[Any, Any]]:
    def w(x: Waiting) -> Any:
        return (x.tenant, x.name, x.claim, x.priority, x.preemptible, x.arrival, x.answered, x.displaced_by)

    def r(x: Running) -> Any:
        return (x.tenant, x.name, x.allocation, x.priority, x.preemptible, x.arrival, x.allocated_order)

    return {k: w(v) for k, v in queue.waiting.items()}, {k: r(v) for k, v in queue.running.items()}


async def test_a_cached_read_equals_a_fresh_one(db_url: str) -> None:
    await migrate(db_url)
    engine = create_engine(db_url)
    make = sessions(engine)
    cache = ops.QueueCache()

    async def check() -> ops.Queue:
        async with make() as session:
            cached = await ops.load_queue(session, cache)
            fresh = await ops.load_queue(session)
        assert _seen(cached) == _seen(fresh)
        return cached

    try:
        async with make() as session, session.begin():
            for i in range(3):
                session.add(Claim(namespace="t", name=f"c{i}", state=State.PENDING.value, spec=_spec(f"c{i}", "t"),
                                  priority=i, sequence=0, arrival=i + 1))
        first = await check()
        assert sorted(first.waiting) == [("t", "c0"), ("t", "c1"), ("t", "c2")] and not first.running
        async with make() as session, session.begin():  # c0 allocated, c1 answered
            rows = await ops.claim_rows(session, first, [("t", "c0"), ("t", "c1")])
            await ops.apply_decision(session, rows[("t", "c0")], Decision(State.ALLOCATED, _allocation("gpu-0")))
            ops.emit_status(session, rows[("t", "c0")])
            rows[("t", "c1")].reason = "waits"
            ops.emit_status(session, rows[("t", "c1")])
        second = await check()
        assert second.running[("t", "c0")].allocation == _allocation("gpu-0")
        assert second.waiting[("t", "c1")].answered and not second.waiting[("t", "c2")].answered
        async with make() as session, session.begin():  # c0 preempted, then placed elsewhere at once
            row = (await ops.claim_rows(session, second, [("t", "c0")]))[("t", "c0")]
            await ops.release_devices(session, row)
            row.state, row.allocation, row.node, row.reason = State.PENDING.value, None, None, None
            ops.emit_status(session, row)
            await ops.apply_decision(session, row, Decision(State.ALLOCATED, _allocation("gpu-1")))
            ops.emit_status(session, row)
        third = await check()
        assert third.running[("t", "c0")].allocation == _allocation("gpu-1")  # read again: its sequence moved
        async with make() as session, session.begin():  # c0 preempted back to the queue, c2 released
            rows = await ops.claim_rows(session, third, [("t", "c0"), ("t", "c2")])
            await ops.release_devices(session, rows[("t", "c0")])
            rows[("t", "c0")].state, rows[("t", "c0")].allocation = State.PENDING.value, None
            ops.emit_status(session, rows[("t", "c0")])
            rows[("t", "c2")].state, rows[("t", "c2")].reason = State.RELEASED.value, "released by the tenant"
            ops.emit_status(session, rows[("t", "c2")])
        fourth = await check()
        assert sorted(fourth.waiting) == [("t", "c0"), ("t", "c1")] and not fourth.running
    finally:
        await engine.dispose()

