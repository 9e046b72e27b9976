"""The allocator's queue read from the ledger gives each running claim its claimbroker.io/expected-runtime
(seconds; None without it, or where it does not read, as in a claim accepted before it was checked): what
start estimates run it for. Kept when a cached read rebuilds the claim for a changed priority."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select, update

from shared.dra.results import Allocation, Decision, DeviceResult, State
from shared.ledger.decisions import claim_rows
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.queue import QueueCache, load_queue
from shared.ledger.schema import Claim
from shared.ledger.unit_of_work import unit_of_work
from tests.builders import a_claim


def _spec(name: str, runtime: str | None) -> dict[str, Any]:
    builder = a_claim(name, "t").request()
    if runtime is not None:
        builder.annotations["claimbroker.io/expected-runtime"] = runtime
    return json.loads(builder.build().model_dump_json(by_alias=True, exclude_none=True))


async def test_running_claims_carry_their_expected_runtime(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    make = sessions(engine)
    cache = QueueCache()
    runtimes = {"hour": "1h", "plain": None, "unread": "soon"}
    try:
        async with make() as session, session.begin():
            for i, (name, runtime) in enumerate(runtimes.items()):
                session.add(Claim(namespace="t", name=name, state=State.PENDING.value, spec=_spec(name, runtime),
                                  sequence=0, arrival=i + 1))
        async with unit_of_work(make) as work:
            queue = await load_queue(work, cache)
            rows = await claim_rows(work, queue, list(queue.waiting))
            for i, row in enumerate(rows.values()):
                work.writes.decision(row, Decision(State.ALLOCATED, Allocation(
                    "n1", (DeviceResult("gpu", "gpu.nvidia.com", "n1", f"gpu-{i}"),))))
                work.writes.status(row)
        async with unit_of_work(make) as work:
            cached = await load_queue(work, cache)
            fresh = await load_queue(work)
        for queue in (cached, fresh):
            assert {k[1]: r.expected_runtime for k, r in queue.running.items()} == {
                "hour": 3600.0, "plain": None, "unread": None}
        async with make() as session, session.begin():  # a changed priority rebuilds the cached claim
            await session.execute(update(Claim).where(Claim.name == "hour").values(priority=5))
            assert await session.scalar(select(Claim.priority).where(Claim.name == "hour")) == 5
        async with unit_of_work(make) as work:
            again = await load_queue(work, cache)
        assert again.running[("t", "hour")].priority == 5
        assert again.running[("t", "hour")].expected_runtime == 3600.0
    finally:
        await engine.dispose()
