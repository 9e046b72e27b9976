"""How long the allocator's event loop is held up while its estimator works (issue 39): the workload of
bench_eta.py (1,000 nodes x 8 GPUs full of running claims, 10,000 waiting over 20 tenants), estimated as the
allocator's estimator does it (services/allocator/estimator.py: estimate_starts in a worker thread, one
EstimateMemo kept), cold then again 5 s later with 5 ended and 5 come, while a probe on the event loop sleeps
2 ms at a time and records how late each wake-up is. Prints one JSON line per run: the thread's CPU seconds,
the wall seconds, the loop's lateness (max and p99, ms) and the same estimate run on the loop itself for
comparison (the loop is then held the whole time). Run: `python bench/bench_estimator_loop.py`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_eta import NOW, build_fleet, build_quotas, observed, running_claims, waiting_claims  # noqa: E402

from services.allocator.estimator import _estimate  # noqa: E402
from shared.admission.estimates import EstimateMemo  # noqa: E402
from shared.admission.model import Snapshot  # noqa: E402
from shared.dra.classes import BUILTIN_CLASSES  # noqa: E402

PERIOD = 0.002


async def probe(lateness: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        await asyncio.sleep(PERIOD)
        lateness.append(loop.time() - before - PERIOD)


async def measured(snapshot: Snapshot, memo: EstimateMemo, runtimes: object, threaded: bool) -> dict[str, float]:
    lateness: list[float] = []
    task = asyncio.create_task(probe(lateness))
    await asyncio.sleep(0)
    started = time.perf_counter()
    if threaded:
        _, cpu = await asyncio.to_thread(_estimate, snapshot, runtimes, memo)  # type: ignore[arg-type]
    else:
        _, cpu = _estimate(snapshot, runtimes, memo)  # type: ignore[arg-type]
        await asyncio.sleep(0)
    wall = time.perf_counter() - started
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    ordered = sorted(lateness) or [wall]
    return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "loop_late_max_ms": round(ordered[-1] * 1e3, 1),
            "loop_late_p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1e3, 1), "wakeups": len(lateness)}


async def main() -> None:
    rng = random.Random(1)
    fleet, quotas = build_fleet(1000), build_quotas(1000)
    running, waiting = running_claims(fleet, rng), waiting_claims(10_000, rng)
    runtimes = observed(rng)
    snapshot = Snapshot(fleet, BUILTIN_CLASSES, quotas, running, waiting, now=NOW)
    ended = set(rng.sample(range(len(running)), 5))
    came = waiting_claims(5, random.Random(2))
    later = Snapshot(fleet, BUILTIN_CLASSES, quotas, tuple(r for i, r in enumerate(running) if i not in ended),
                     waiting + tuple(replace(w, name=f"late-{w.name}") for w in came), now=NOW + 5)
    gc.collect()
    gc.freeze()
    for threaded in (True, False):
        memo = EstimateMemo()
        for label, snap in (("cold", snapshot), ("again", later)):
            figures = await measured(snap, memo, runtimes, threaded)
            print(json.dumps({"where": "thread" if threaded else "loop", "run": label, **figures}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
