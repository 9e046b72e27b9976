"""Allocation throughput of the pure core on a large fleet; prints one JSON line per scenario."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared import dra  # noqa: E402
from shared.allocation import SelectorMemo, settle  # noqa: E402
from shared.classes import BUILTIN_CLASSES  # noqa: E402
from shared.inventory import Fleet  # noqa: E402
from shared.sources import documents_from  # noqa: E402

MODELS = ("A100", "H100", "H200", "B200")


def fleet(nodes: int) -> Fleet:
    topology = {"kind": "Topology", "nodes": [
        {"namePrefix": f"{m.lower()}-", "count": nodes // len(MODELS), "gpuModel": m, "gpuCount": 8, "numaNodes": 2}
        for m in MODELS]}
    docs = documents_from([topology], "bench")
    return Fleet.from_slices(docs.slices, docs.labels)


def claim(i: int) -> dra.ResourceClaim:
    model = MODELS[i % len(MODELS)]
    return dra.parse_claim({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"c{i}", "namespace": f"t{i % 10}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": 1 + i % 2,
            "selectors": [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].productName == "{model}"'}}]}}],
            "constraints": [{"matchAttribute": "gpu.nvidia.com/numa-node"}]}},
    })


def main() -> None:
    for nodes, claims in ((100, 500), (1000, 1000)):
        f = fleet(nodes)
        batch = [claim(i) for i in range(claims)]
        memo = SelectorMemo()
        start = time.perf_counter()
        outcomes = settle(batch, f, BUILTIN_CLASSES, (), memo=memo)
        elapsed = time.perf_counter() - start
        allocated = sum(o.decision.allocation is not None for o in outcomes)
        print(json.dumps({"bench": "settle", "nodes": nodes, "devices": len(f.devices), "claims": claims,
                          "allocated": allocated, "claims_per_s": round(claims / elapsed, 1),
                          "cel_evaluations": memo.evaluations}))


if __name__ == "__main__":
    main()
