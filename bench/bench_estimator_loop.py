"""How long the allocator's event loop is held up while its estimator works (issue 39): the workload of
bench_eta.py (1,000 nodes x 8 GPUs full of running claims, 10,000 waiting over 20 tenants), estimated as the
allocator's estimator does it (services/allocator/estimator.py: estimate_starts in a worker thread, one
EstimateMemo kept), cold then again 5 s later with 5 ended and 5 come. Beside it on the event loop, a probe
that sleeps 2 ms at a time and records how late each wake-up is; then, instead, stand-ins for decision cycles
(20 ms of CPU each), whose wall time over CPU time says how much slower cycles run meanwhile (the GIL is
shared). Last, the same estimate run on the loop itself (the loop is then held the whole time). One JSON line
per run. Run: `python bench/bench_estimator_loop.py`."""

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


async def cycles(stretch: list[float]) -> None:
    """Stand-ins for decision cycles on the loop: 20 ms of CPU each, then a turn of the loop; each one's wall
    time over its CPU time (how much slower a cycle is while the estimate runs beside it)."""
    while True:
        wall, cpu = time.perf_counter(), time.thread_time()
        while time.thread_time() - cpu < 0.02:
            pass
        stretch.append((time.perf_counter() - wall) / (time.thread_time() - cpu))
        await asyncio.sleep(0.001)


async def measured(snapshot: Snapshot, memo: EstimateMemo, runtimes: object, threaded: bool,
                   busy_loop: bool) -> dict[str, float]:
    lateness: list[float] = []
    stretch: list[float] = []
    task = asyncio.create_task(probe(lateness)) if not busy_loop else None
    busy = asyncio.create_task(cycles(stretch)) if busy_loop else None
    await asyncio.sleep(0)
    started = time.perf_counter()
    if threaded:
        _, cpu = await asyncio.to_thread(_estimate, snapshot, runtimes, memo)  # type: ignore[arg-type]
    else:
        _, cpu = _estimate(snapshot, runtimes, memo)  # type: ignore[arg-type]
        await asyncio.sleep(0)
    wall = time.perf_counter() - started
    for each in (task, busy):
        if each is not None:
            each.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await each
    figures: dict[str, float] = {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}
    if busy_loop:
        figures["cycle_stretch_median"] = round(sorted(stretch)[len(stretch) // 2], 2) if stretch else 0.0
        figures["cycles"] = len(stretch)
    else:
        ordered = sorted(lateness) or [wall]
        figures.update({"loop_late_max_ms": round(ordered[-1] * 1e3, 1),
                        "loop_late_p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1e3, 1),
                        "wakeups": len(lateness)})
    return figures


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
    for threaded, busy_loop in ((True, False), (True, True), (False, False)):
        memo = EstimateMemo()
        for label, snap in (("cold", snapshot), ("again", later)):
            figures = await measured(snap, memo, runtimes, threaded, busy_loop)
            print(json.dumps({"where": "thread" if threaded else "loop", "beside": "cycles" if busy_loop else "probe",
                              "run": label, **figures}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
