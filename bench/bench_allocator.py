"""Allocator service cycle (issue 4): the whole decision transaction of the allocator, as `serve` runs it,
on a ledger with a waiting queue held at a depth of 1,000 and of 10,000 claims. The fleet, quotas and claims
are `bench_quota`'s (1,000 nodes of 8 GPUs, 100 tenants in 10 cohorts). As in a steady state of `serve`
with its default batch of 64 messages, each transaction is one batch of claim messages through the
allocator's own handling (inbox, submissions, releases): 32 releases of running claims and the submissions
that keep the depth (about as many as the last transaction admitted); it reads the queue and the quotas,
runs the decision cycle and writes every decision with its status events and history, then commits. The
fleet is filled first (on PostgreSQL, then vacuumed and analysed, as autovacuum keeps a running ledger).
Prints one JSON line per depth: admissions per second of transaction time, and the transaction's p50 and
p99. After every measured transaction (outside the timing) the quota invariants are checked on what the
ledger holds allocated (shared/admission/invariant.py): `quota_violations` counts the transactions that left one
broken, with the first messages.

Run: `make bench-allocator` (SQLite in a temporary directory), or
`python bench/bench_allocator.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/DB --depth 1000` on an
empty database.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_quota  # noqa: E402
from ledger_runs import maintain, run_depths  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from services.allocator.service import Allocator  # noqa: E402
from shared.admission.flavors import Flavors  # noqa: E402
from shared.admission.invariant import violations  # noqa: E402
from shared.admission.model import Running  # noqa: E402
from shared.contract import subjects  # noqa: E402
from shared.dra.classes import BUILTIN_CLASSES  # noqa: E402
from shared.dra.matching import SelectorMemo  # noqa: E402
from shared.dra.results import (
    Allocation,  # noqa: E402
    State,  # noqa: E402
)
from shared.ledger.engine import create_engine, migrate  # noqa: E402
from shared.ledger.quota_store import apply_quota_config  # noqa: E402
from shared.ledger.schema import Claim  # noqa: E402

MEASURED = 30
RELEASES = 32  # half of the allocator's default batch
NODES = 1000


def _message(subject: str, body: dict[str, Any], serial: int) -> Any:
    """What the allocator reads of a JetStream message."""
    return SimpleNamespace(subject=subject, data=json.dumps(body).encode(), headers={"Nats-Msg-Id": f"m{serial}"},
                           metadata=SimpleNamespace(sequence=SimpleNamespace(stream=serial)))


async def run(url: str, depth: int) -> dict[str, Any]:
    rng = random.Random(bench_quota.SEED)
    fleet = bench_quota.build_fleet(NODES)
    quotas = bench_quota.build_quotas(NODES, rng)
    await migrate(url)
    engine = create_engine(url)
    allocator = Allocator(engine, BUILTIN_CLASSES)
    allocator.fleet = fleet
    admitted: list[int] = []
    flavors = Flavors(quotas.flavors, SelectorMemo())
    broken, first = 0, list[str]()
    serial = 0
    try:
        async with allocator.sessions() as session, session.begin():
            await apply_quota_config(session, quotas, "bench")
        times: list[float] = []
        warming = True
        while len(times) < MEASURED:
            async with allocator.sessions() as session:  # what the tenants would release and submit
                pending = await session.scalar(select(func.count()).select_from(Claim)
                                               .where(Claim.state == State.PENDING.value))
                running = [] if warming else [tuple(row) for row in await session.execute(
                    select(Claim.namespace, Claim.name).where(Claim.state == State.ALLOCATED.value))]
            messages = [_message(subjects.release(tenant), {"name": name}, serial + i)
                         for i, (tenant, name) in enumerate(rng.sample(sorted(running), min(RELEASES, len(running))))]
            serial += len(messages)
            for _ in range(depth - (pending or 0)):
                serial += 1
                claim = bench_quota.new_claim(rng, serial).claim
                messages.append(_message(subjects.submit(claim.metadata.namespace or "default"),
                                         claim.model_dump(by_alias=True, exclude_none=True), serial))
            started = time.perf_counter()
            await allocator.transaction.decide(messages)  # one transaction, as serve runs a batch
            elapsed = time.perf_counter() - started
            admitted.append(allocator.transaction.decided[State.ALLOCATED.value])  # an Allocated status each
            if warming:
                warming = admitted[-1] > 0 if admitted else True
                if not warming and engine.dialect.name == "postgresql":
                    await maintain(engine)
                continue
            times.append(elapsed)
            async with allocator.sessions() as session:  # what the ledger holds allocated, as committed
                held = [Running(t, n, Allocation.from_json(a)) for t, n, a in await session.execute(
                    select(Claim.namespace, Claim.name, Claim.allocation)
                    .where(Claim.state == State.ALLOCATED.value))]
            found = violations(fleet, quotas, held, flavors)
            broken += bool(found)
            first = first or found[:3]
        count = sum(admitted[-MEASURED:])
        times.sort()
        return {"nodes": NODES, "queue_depth": depth, "transactions": MEASURED, "admitted": count,
                "admissions_per_s": round(count / sum(times), 1),
                "transaction_p50_ms": round(statistics.median(times) * 1000, 1),
                "transaction_p99_ms": round(times[-1] * 1000, 1), "database": url.split(":")[0],
                "quota_violations": {"transactions": broken, "checked": MEASURED, "first": first}}
    finally:
        await engine.dispose()


def main() -> None:
    run_depths(__doc__, run)


if __name__ == "__main__":
    main()
