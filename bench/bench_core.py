"""Decision-core benchmark (issue 3): a mixed fleet of 100, 1,000 and 4,000 nodes with 8 GPUs each
(A100-40GB to B300, a quarter in MIG mode, two NUMA nodes) decides 10,000 mixed claims (1 to 8 GPUs,
selectors on product, memory and compute capability, NUMA constraints, MIG slices) one after another,
each seeing the allocations before it. Prints one JSON line per fleet size.

Run: `make bench-core` (or `python bench/bench_core.py --nodes 1000 --claims 2000` for one size).
Only the decisions are timed: building the fleet and parsing the claims are not.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.dra import model as dra  # noqa: E402
from shared.dra.allocation import FleetState  # noqa: E402
from shared.dra.classes import BUILTIN_CLASSES  # noqa: E402
from shared.dra.inventory import Fleet  # noqa: E402
from shared.dra.matching import SelectorMemo  # noqa: E402
from shared.fleet.sources import documents_from  # noqa: E402

MODELS = ("A100-40GB", "A100", "H100", "H200", "B200", "B300")
PRODUCTS = ("A100", "H100", "H200", "B200", "B300")
MIG_LAYOUTS = ("all-balanced", "all-1g.10gb", "dynamic")


def build_fleet(nodes: int) -> Fleet:
    """Node i: model i mod 6; every fourth node in MIG mode (static layouts and DynamicMIG)."""
    specs: list[dict[str, Any]] = []
    for i in range(nodes):
        model = MODELS[i % len(MODELS)]
        spec: dict[str, Any] = {"name": f"node-{i:05d}", "gpuModel": model, "gpuCount": 8, "numaNodes": 2}
        if i % 4 == 3:
            layout = MIG_LAYOUTS[(i // 4) % len(MIG_LAYOUTS)]
            if layout == "all-1g.10gb":
                layout = "all-" + _smallest_profile(model)
            spec["mig"] = {g: layout for g in range(8)}
        specs.append(spec)
    docs = documents_from([{"kind": "Topology", "nodes": specs}], "bench")
    return Fleet.from_slices(docs.slices, docs.labels)


def _smallest_profile(model: str) -> str:
    from shared.fleet.topology import lookup_model

    return lookup_model(model).profiles[0].name


def _request(count: int, selectors: list[str], cls: str = "gpu.nvidia.com") -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": "gpu", "exactly": body}


def build_claims(count: int, seed: int = 7) -> list[dra.ResourceClaim]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = rng.random()
        constraints: list[dict[str, Any]] = []
        if kind < 0.2:  # MIG slice, by profile memory
            gib = rng.choice((5, 10, 20, 40))
            request = _request(rng.choice((1, 1, 2)), [
                f'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{gib}Gi")) >= 0'], "mig.nvidia.com")
        else:
            gpus = rng.choice((1, 1, 1, 2, 2, 4, 4, 8))
            selectors = []
            pick = rng.random()
            if pick < 0.35:
                selectors.append(f'device.attributes["gpu.nvidia.com"].productName.contains("{rng.choice(PRODUCTS)}")')
            elif pick < 0.6:
                gib = rng.choice((40, 80, 120, 160))
                selectors.append(f'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{gib}Gi")) >= 0')
            elif pick < 0.8:
                major = rng.choice((8, 9, 10))
                selectors.append('device.attributes["gpu.nvidia.com"].cudaComputeCapability'
                                 f'.compareTo(semver("{major}.0.0")) >= 0')
            request = _request(gpus, selectors)
            if gpus in (2, 4) and rng.random() < 0.5:
                constraints.append({"matchAttribute": "gpu.nvidia.com/numa-node"})
        out.append(dra.parse_claim({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c{i}", "namespace": f"t{i % 20}"},
            "spec": {"devices": {"requests": [request], "constraints": constraints}},
        }))
    return out


def run(nodes: int, claims: int) -> dict[str, Any]:
    fleet = build_fleet(nodes)
    batch = build_claims(claims)
    fleet.nodes_by_shape  # noqa: B018 - device kinds and node shapes are worked out when inventory arrives
    gc.collect()
    gc.freeze()  # the fleet is long-lived: keep the cyclic GC from rescanning it (the allocator freezes what
    # each cycle keeps: services/runtime/gc_tuning.py)
    memo = SelectorMemo()
    state = FleetState(fleet, BUILTIN_CLASSES, (), memo=memo)
    latencies = []
    allocated = 0
    decided = []
    started = time.perf_counter()
    for claim in batch:
        t0 = time.perf_counter()
        decision = state.decide(claim)
        if decision.allocation is not None:
            state.take(decision.allocation)
            allocated += 1
        latencies.append(time.perf_counter() - t0)
        decided.append((decision.state.value, decision.allocation.node, decision.allocation.keys)
                       if decision.allocation is not None else (decision.state.value,))
    elapsed = time.perf_counter() - started
    # what was decided (claim order, state, node, devices): a refactor must leave it equal
    digest = hashlib.sha256(repr(decided).encode()).hexdigest()[:16]
    latencies.sort()
    return {"nodes": nodes, "devices": len(fleet.devices), "claims": claims, "allocated": allocated,
            "claims_per_s": round(claims / elapsed, 1),
            "p50_ms": round(statistics.median(latencies) * 1000, 3),
            "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
            "cel_evaluations": memo.evaluations, "decisions": digest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="fleet size (repeatable)")
    parser.add_argument("--claims", type=int, default=10_000)
    args = parser.parse_args()
    for nodes in args.nodes or (100, 1000, 4000):
        print(json.dumps(run(nodes, args.claims)), flush=True)


if __name__ == "__main__":
    main()
