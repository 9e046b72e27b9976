"""Start-estimate benchmark (issue 39): `estimate_starts` on 1,000 nodes x 8 GPUs (five models) full of
running claims (1 to 8 GPUs each, runtimes spread from 10 minutes to a day, allocated at spread times before
now; half say their claimbroker.io/expected-runtime, the rest are estimated by their tenant's observed
quantiles), 20 tenants in one cohort with a nominal quota each per model, and 10,000 waiting claims over
those tenants (1 to 8 GPUs, 60 % of them on one model, priorities 0 to 2, half with an expected runtime).
Prints one JSON line: CPU seconds (time.process_time) for estimating every waiting claim (both forward runs)
from cold (`cpu_s`: nothing kept, as the first estimate after a start) and again a few seconds later with 5
claims ended and 5 arrived, going on from what the first call kept (`cpu_again_s`: EstimateMemo, as the shell
keeps it between estimates), how many got an estimate each time, and where the p50s fall (hours ahead).
Run: `make bench-eta` (or `python bench/bench_eta.py --exact 2000 --seed 3`).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.runtime.gc_tuning import CollectorPacing  # noqa: E402
from shared.admission.estimates import (  # noqa: E402
    EXACT_ADMISSIONS,
    EstimateMemo,
    Quantiles,
    Runtimes,
    estimate_starts,
)
from shared.admission.model import Running, Snapshot, Waiting  # noqa: E402
from shared.admission.quota import QuotaConfig, parse_quotas  # noqa: E402
from shared.dra import model as dra  # noqa: E402
from shared.dra.classes import BUILTIN_CLASSES  # noqa: E402
from shared.dra.inventory import Fleet  # noqa: E402
from shared.dra.results import Allocation, DeviceResult  # noqa: E402
from shared.fleet.sources import documents_from  # noqa: E402

MODELS = ("A100", "H100", "H200", "B200", "B300")
TENANTS = 20
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the estimate's clock, not the wall's


def build_fleet(nodes: int) -> Fleet:
    specs = [{"name": f"node-{i:05d}", "gpuModel": MODELS[i % len(MODELS)], "gpuCount": 8, "numaNodes": 2}
             for i in range(nodes)]
    docs = documents_from([{"kind": "Topology", "nodes": specs}], "bench")
    fleet = Fleet.from_slices(docs.slices, docs.labels)
    fleet.nodes_by_shape  # noqa: B018 - worked out when inventory arrives, not per estimate
    return fleet


def build_quotas(nodes: int) -> QuotaConfig:
    nominal = nodes * 8 // len(MODELS) // TENANTS
    return parse_quotas({"kind": "Quotas", "cohorts": [{"name": "all"}], "tenants": [
        {"name": f"t{t:02d}", "cohort": "all", "quotas": {m: {"nominal": nominal} for m in MODELS}}
        for t in range(TENANTS)]})


def runtime(rng: random.Random) -> float:
    """Lognormal around 2 hours, between 10 minutes and a day."""
    return min(86400.0, max(600.0, rng.lognormvariate(8.9, 1.0)))


def document(name: str, tenant: str, count: int, model: str | None, priority: int,
             expected: float | None) -> dra.ResourceClaim:
    body: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if model is not None:
        body["selectors"] = [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].productName == "{model}"'}}]
    annotations = {"claimbroker.io/priority": str(priority)}
    if expected is not None:
        annotations["claimbroker.io/expected-runtime"] = f"{int(expected)}s"
    return dra.parse_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": name, "namespace": tenant, "annotations": annotations},
                            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}}})


def running_claims(fleet: Fleet, rng: random.Random) -> tuple[Running, ...]:
    """Every GPU of every node held, each node's 8 split into claims of 8, 4, 2 or 1 of one tenant: of each
    model's nodes, each tenant holds its nominal's worth (so no tenant borrows), at the highest priority the
    waiting claims have. A settled state, as the allocator leaves it: no waiting claim could preempt now."""
    out = []
    serial = 0
    per_model: dict[str, int] = {}
    nodes_each = len(fleet.nodes) // len(MODELS) // TENANTS
    for name, inventory in sorted(fleet.nodes.items()):
        devices = [d for d in inventory.devices if d.attributes.get("gpu.nvidia.com/type") == "gpu"]
        model = str(devices[0].attributes["gpu.nvidia.com/productName"])
        index = per_model[model] = per_model.get(model, -1) + 1
        tenant = f"t{min(index // nodes_each, TENANTS - 1):02d}"
        at = 0
        while at < len(devices):
            count = min(rng.choice((1, 2, 4, 8)), len(devices) - at)
            held = devices[at:at + count]
            at += count
            serial += 1
            took = runtime(rng)
            results = tuple(DeviceResult("gpu", d.driver, d.pool, d.name) for d in held)
            out.append(Running(tenant, f"r{serial}", Allocation(name, results), 2, True, serial, serial,
                               NOW - rng.uniform(0, took), None, took if rng.random() < 0.5 else None))
    return tuple(out)


def waiting_claims(depth: int, rng: random.Random) -> tuple[Waiting, ...]:
    out = []
    for serial in range(1, depth + 1):
        tenant = f"t{rng.randrange(TENANTS):02d}"
        priority = rng.choice((0, 0, 0, 1, 2))
        model = rng.choice(MODELS) if rng.random() < 0.6 else None
        expected = runtime(rng) if rng.random() < 0.5 else None
        claim = document(f"w{serial}", tenant, rng.choice((1, 1, 2, 2, 4, 8)), model, priority, expected)
        out.append(Waiting(tenant, f"w{serial}", claim, priority, True, 100_000 + serial, answered=True))
    return tuple(out)


def observed(rng: random.Random) -> Runtimes:
    by_tenant = {f"t{t:02d}": Quantiles(p50 := runtime(rng), p50 * rng.uniform(1.5, 3.0)) for t in range(TENANTS)}
    return Runtimes(by_tenant=by_tenant, default=Quantiles(3600.0, 4 * 3600.0))


def run(nodes: int, depth: int, seed: int, exact: int) -> dict[str, Any]:
    rng = random.Random(seed)
    fleet = build_fleet(nodes)
    quotas = build_quotas(nodes)
    running = running_claims(fleet, rng)
    waiting = waiting_claims(depth, rng)
    snapshot = Snapshot(fleet, BUILTIN_CLASSES, quotas, running, waiting, now=NOW)
    runtimes = observed(rng)
    memo = EstimateMemo()  # what the shell keeps from one estimate to the next
    gc.collect()
    gc.freeze()
    collector = CollectorPacing()
    started = time.process_time()
    estimates = estimate_starts(snapshot, runtimes, exact=exact, memo=memo)
    cold = time.process_time() - started
    collector.after_cycle()  # what the estimate keeps is frozen after it, as the services pace the collector
    # a few seconds later: 5 claims ended, 5 came (the shell estimates again only when something changed)
    ended = set(rng.sample(range(len(running)), 5))
    came = waiting_claims(5, random.Random(seed + 1))
    later = Snapshot(fleet, BUILTIN_CLASSES, quotas, tuple(r for i, r in enumerate(running) if i not in ended),
                     waiting + tuple(replace(w, name=f"late-{w.name}") for w in came), now=NOW + 5)
    started = time.process_time()
    again = estimate_starts(later, runtimes, exact=exact, memo=memo)
    warm = time.process_time() - started
    given = [e for e in estimates.values() if e.p50 is not None]
    ahead = sorted(e.p50 - NOW for e in given if e.p50 is not None)
    return {"nodes": nodes, "gpus": nodes * 8, "running": len(snapshot.running), "waiting": depth,
            "tenants": TENANTS, "exact_admissions": exact, "estimated": len(given),
            "estimated_again": sum(1 for e in again.values() if e.p50 is not None),
            "cpu_s": round(cold, 3), "cpu_again_s": round(warm, 3),
            "p50_ahead_h": {q: round(ahead[int(q / 100 * (len(ahead) - 1))] / 3600, 2) for q in (10, 50, 90)}
            if ahead else {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--exact", type=int, default=EXACT_ADMISSIONS,
                        help="claims each forward run admits exactly before it extrapolates")
    args = parser.parse_args()
    print(json.dumps(run(args.nodes, args.depth, args.seed, args.exact)))


if __name__ == "__main__":
    main()
