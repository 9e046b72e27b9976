"""Allocator queue read (issue 4): what one decision transaction pays to read the queue from the ledger at a
depth of 1,000 and of 10,000 claims, with 300 claims written by each transaction (answered, so the depth
stays). `kept` is the allocator's read with its cache kept from the last transaction (only the rows written
since); `every_row` is a read of every queued row's columns, as one without a kept cache (or the previous
version) does. Prints one JSON line per depth; medians and minima over 10 transactions after a first one.
On PostgreSQL the filled database is vacuumed and analysed first, as autovacuum keeps a running ledger.

Run: `make bench-queue` (SQLite in a temporary directory), or
`python bench/bench_queue_read.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/DB` on an empty database.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ledger_runs import maintain, run_depths  # noqa: E402

from shared.dra.results import State  # noqa: E402
from shared.ledger.decisions import claim_rows  # noqa: E402
from shared.ledger.engine import create_engine, migrate, sessions  # noqa: E402
from shared.ledger.queue import QueueCache, load_queue  # noqa: E402
from shared.ledger.schema import Claim  # noqa: E402
from shared.ledger.unit_of_work import unit_of_work  # noqa: E402

CHANGED = 300
TRANSACTIONS = 10


def _spec(name: str, tenant: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": tenant},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                          "count": count}}]}}}


async def run(url: str, depth: int) -> dict[str, Any]:
    await migrate(url)
    engine = create_engine(url)
    make = sessions(engine)
    try:
        async with unit_of_work(make) as work:
            await work.take_turn("bench", "bench", 0.0)
            work.session.add_all(Claim(namespace=f"t{i % 100}", name=f"c{i}", state=State.PENDING.value,
                                  spec=_spec(f"c{i}", f"t{i % 100}", 1 + i % 4), sequence=0, arrival=i + 1)
                            for i in range(depth))
        if engine.dialect.name == "postgresql":
            await maintain(engine)
        cache = QueueCache()
        kept, every_row = [], []
        for n in range(TRANSACTIONS + 1):
            async with unit_of_work(make) as work:
                await work.take_turn("bench", "bench", 0.0)
                started = time.perf_counter()
                queue = await load_queue(work, cache)
                kept.append(time.perf_counter() - started)
                started = time.perf_counter()
                await load_queue(work, QueueCache(documents=dict(cache.documents)))
                every_row.append(time.perf_counter() - started)
                keys = list(queue.waiting)[n * CHANGED % len(queue.waiting):][:CHANGED]
                rows = await claim_rows(work, queue, keys)
                for key in keys:  # what a cycle writes: answers, with their status events
                    rows[key].reason = f"waits ({n})"
                    work.writes.status(rows[key])
        kept, every_row = kept[1:], every_row[1:]  # the first read is a full one either way
        return {"queue_depth": depth, "changed_per_transaction": CHANGED, "rows_read": cache.rows_read,
                "kept_p50_ms": round(statistics.median(kept) * 1000, 1), "kept_min_ms": round(min(kept) * 1000, 1),
                "every_row_p50_ms": round(statistics.median(every_row) * 1000, 1),
                "every_row_min_ms": round(min(every_row) * 1000, 1), "database": url.split(":")[0]}
    finally:
        await engine.dispose()


def main() -> None:
    run_depths(__doc__, run)


if __name__ == "__main__":
    main()
