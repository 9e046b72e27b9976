"""Placement budget benchmark (issue 35): what a unit of shared/dra/budget.py costs in time, per kind of work,
and what claims that exhaust the placement search cost everyone else.

1. Calibration: microseconds per unit for a search step, a CEL compilation, a CEL evaluation and an index
   built over the fleet, each measured on its own (the weights in budget.py should make these alike).
2. The compute bomb the probe used: claims of 32 requests, each a firstAvailable of 8 subrequests with
   distinct selectors, under a matchAttribute on the GPU's uuid (no node can ever hold one). They wait
   while a calm tenant's claim arrives every cycle and the previous one is released (churn). Printed: the
   cycle's time alone and beside 16, 50 and 200 such claims (p50, p99, max), the process's memory, and how
   many of the bombs were prepared and searched in full by the end.

Prints one JSON line per measurement. Run: `python bench/bench_budget.py [--nodes 100] [--cycles 600]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.runtime.gc_tuning import CollectorPacing, tune_gc  # noqa: E402
from shared.admission.cycle import run_cycle  # noqa: E402
from shared.admission.kept import KeptState  # noqa: E402
from shared.admission.model import Running, Snapshot, Waiting  # noqa: E402
from shared.admission.quota import QuotaConfig  # noqa: E402
from shared.dra import budget  # noqa: E402
from shared.dra import model as dra  # noqa: E402
from shared.dra.allocation import FleetState  # noqa: E402
from shared.dra.cel import compile_selector, device_activation, evaluate  # noqa: E402
from shared.dra.classes import BUILTIN_CLASSES  # noqa: E402
from shared.dra.inventory import Fleet  # noqa: E402
from shared.fleet.sources import documents_from  # noqa: E402

MODELS = ("A100", "H100", "H200", "B200", "B300")
ATTR = 'device.attributes["gpu.nvidia.com"]'


def build_fleet(nodes: int) -> Fleet:
    specs = [{"name": f"node-{i:05d}", "gpuModel": MODELS[i % len(MODELS)], "gpuCount": 8, "numaNodes": 2}
             for i in range(nodes)]
    docs = documents_from([{"kind": "Topology", "nodes": specs}], "bench")
    fleet = Fleet.from_slices(docs.slices, docs.labels)
    fleet.nodes_by_shape  # noqa: B018 - worked out when inventory arrives, not per decision
    return fleet


def claim(name: str, namespace: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None
          ) -> dra.ResourceClaim:
    return dra.parse_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": name, "namespace": namespace},
                            "spec": {"devices": {"requests": requests, "constraints": constraints or []}}})


def bomb(i: int) -> dra.ResourceClaim:
    """The probe's claim: every subrequest's selector is its own text, and no node has 32 GPUs of one uuid."""
    requests = [{"name": f"r{r}", "firstAvailable": [
        {"name": f"s{s}", "deviceClassName": "gpu.nvidia.com", "count": 1,
         "selectors": [{"cel": {"expression": f'{ATTR}.productName != "x-{i}-{r}-{s}"'}}]} for s in range(8)]}
        for r in range(32)]
    return claim(f"bomb-{i}", "evil", requests, [{"matchAttribute": "gpu.nvidia.com/uuid"}])


def calm(i: int) -> dra.ResourceClaim:
    return claim(f"calm-{i}", "calm", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}])


def per_unit(seconds: float, units: int) -> float:
    return round(seconds / units * 1e6, 2)


def calibrate(fleet: Fleet) -> dict[str, Any]:
    """Microseconds per unit of each kind of work, measured alone."""
    out: dict[str, Any] = {"measure": "calibration", "nodes": len(fleet.nodes)}
    texts = [f'{ATTR}.productName != "calibrate-{i}"' for i in range(300)]
    started = time.perf_counter()
    compiled = [compile_selector(t) for t in texts]
    out["compile_us_per_unit"] = per_unit(time.perf_counter() - started, budget.COMPILE * len(texts))
    device = next(iter(fleet.nodes.values())).devices[0]
    activation = device_activation(device.driver, {"gpu.nvidia.com": {"productName": "H100"}}, {})
    started = time.perf_counter()
    for selector in compiled:
        evaluate(selector, activation)
    out["evaluation_us_per_unit"] = per_unit(time.perf_counter() - started, budget.EVALUATION * len(compiled))
    state = FleetState(fleet, BUILTIN_CLASSES, ())
    wide = claim("wide", "t", [{"name": f"r{r}", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
                               for r in range(8)], [{"distinctAttribute": "gpu.nvidia.com/uuid"},
                                                    {"matchAttribute": "gpu.nvidia.com/productName"}])
    state.decide(wide)  # indexes built
    index_state = FleetState(fleet, BUILTIN_CLASSES, ())
    meter = budget.Meter(10**9)
    started = time.perf_counter()
    for r in range(20):  # distinct tolerations make distinct indexes, over selector results already known
        toleration = [{"key": f"k{r}", "operator": "Exists"}]
        plan = index_state.plan(claim(f"i{r}", "t", [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": 1, "tolerations": toleration}}]))
        with index_state.metered(meter):
            index_state.capacity_version(plan)
    out["index_us_per_unit"] = per_unit(time.perf_counter() - started, max(1, meter.spent))
    blocked = claim("blocked", "t", [{"name": f"r{r}", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
                                     for r in range(4)], [{"matchAttribute": "gpu.nvidia.com/uuid"}])
    search = FleetState(fleet, BUILTIN_CLASSES, ())
    meter = budget.Meter(200_000)
    search.decide(blocked, meter=budget.Meter(budget.ONE_SHOT_BUDGET))  # indexes built, sweep done
    search.forget(search.plan(blocked))
    started = time.perf_counter()
    search.decide(blocked, meter=meter)
    out["search_us_per_unit"] = per_unit(time.perf_counter() - started, max(1, meter.spent))
    return out


def churn(fleet: Fleet, bombs: int, cycles: int) -> dict[str, Any]:
    """A calm claim arrives each cycle and the last one is released, beside `bombs` waiting bombs."""
    classes, quotas, kept = dict(BUILTIN_CLASSES), QuotaConfig(), KeptState()
    waiting: dict[tuple[str, str], Waiting] = {}
    for i in range(bombs):
        w = Waiting("evil", f"bomb-{i}", bomb(i), arrival=i)
        waiting[w.key] = w
    running: dict[tuple[str, str], Running] = {}
    run_cycle(Snapshot(fleet, classes, quotas), kept)  # flavors worked out, as a running allocator has them
    pacing = CollectorPacing()
    gc.collect()
    rss_before = _rss_mb()
    times, last_calm, order, answers = [], None, 0, {}
    for c in range(cycles):
        if last_calm is not None:
            running.pop(last_calm, None)
        w = Waiting("calm", f"calm-{c}", calm(c), arrival=1_000_000 + c)
        waiting[w.key] = w
        started = time.perf_counter()
        result = run_cycle(Snapshot(fleet, classes, quotas, tuple(running.values()), tuple(waiting.values())), kept)
        times.append(time.perf_counter() - started)
        pacing.after_cycle()
        for d in result.decisions:
            key = (d.tenant, d.name)
            answers[key] = d.decision
            if d.decision.allocation is not None:
                order += 1
                done = waiting.pop(key)
                running[key] = Running(done.tenant, done.name, d.decision.allocation, allocated_order=order)
                last_calm = key
            elif key in waiting and not waiting[key].answered:
                waiting[key] = replace(waiting[key], answered=True)
    state = kept.admission
    assert state is not None
    cut = sum(1 for k, d in answers.items() if k[0] == "evil" and d.cut)
    ms = sorted(t * 1000 for t in times[cycles // 10:])  # past the first tenth: the bombs' intake
    return {"measure": "churn", "nodes": len(fleet.nodes), "bombs": bombs, "cycles": cycles,
            "cycle_p50_ms": round(statistics.median(ms), 2), "cycle_p99_ms": round(ms[int(len(ms) * 0.99) - 1], 2),
            "cycle_max_ms": round(ms[-1], 2), "rss_mb": round(_rss_mb(), 1), "rss_before_mb": round(rss_before, 1),
            "bombs_unprepared": len(state.queue.unprepared), "bombs_answered_cut": cut}


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--cycles", type=int, default=600)
    parser.add_argument("--bombs", type=int, nargs="*", default=[0, 16, 50, 200])
    args = parser.parse_args()
    tune_gc()
    fleet = build_fleet(args.nodes)
    print(json.dumps(calibrate(fleet)), flush=True)
    for bombs in args.bombs:
        print(json.dumps(churn(build_fleet(args.nodes), bombs, args.cycles)), flush=True)


if __name__ == "__main__":
    main()
