"""Partitionable devices (DRA sharedCounters / consumesCounters), as NVIDIA's DynamicMIG publishes them:
a full GPU and its MIG partitions exclude each other, and partitions never over-subscribe the GPU."""

from __future__ import annotations

from typing import Any

from shared.dra import model as dra
from shared.dra.allocation import settle
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.dra.results import State
from tests.builders import a_claim


def _slices() -> list[dra.ResourceSlice]:
    def consumes(slots: range) -> list[dict[str, Any]]:
        return [{"counterSet": "gpu-0-counter-set",
                 "counters": {f"memory-slice-{i}": {"value": "1"} for i in slots}}]

    def device(name: str, kind: str, slots: range, profile: str | None = None) -> dict[str, Any]:
        attributes: dict[str, Any] = {"type": {"string": kind}, "productName": {"string": "NVIDIA H100 80GB HBM3"}}
        if profile:
            attributes["profile"] = {"string": profile}
        return {"name": name, "attributes": attributes, "consumesCounters": consumes(slots)}

    pool = {"name": "n1", "generation": 1, "resourceSliceCount": 2}
    documents = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "counters"},
         "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": pool, "sharedCounters": [
             {"name": "gpu-0-counter-set", "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(8)}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "devices"},
         "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": pool, "devices": [
             device("gpu-0", "gpu", range(8)),
             device("gpu-0-mig-3g40gb-9-0", "mig", range(0, 4), "3g.40gb"),
             device("gpu-0-mig-3g40gb-9-4", "mig", range(4, 8), "3g.40gb"),
         ]}},
    ]
    return [dra.ResourceSlice.model_validate(d) for d in documents]


def test_full_gpu_and_partitions_exclude_each_other() -> None:
    fleet = Fleet.from_slices(_slices(), {})
    slice_claim = a_claim("slice-1").request(cls="mig.nvidia.com").build()
    whole = a_claim("whole").request().build()
    second = a_claim("slice-2").request(cls="mig.nvidia.com").build()
    third = a_claim("slice-3").request(cls="mig.nvidia.com").build()
    outcomes = settle([slice_claim, whole, second, third], fleet, BUILTIN_CLASSES, ())
    states = [o.decision.state for o in outcomes]
    assert states == [State.ALLOCATED, State.PENDING, State.ALLOCATED, State.PENDING]
    devices = [o.decision.allocation.results[0].device for o in outcomes if o.decision.allocation]
    assert sorted(devices) == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]


def test_a_taken_full_gpu_blocks_every_partition() -> None:
    fleet = Fleet.from_slices(_slices(), {})
    outcomes = settle([a_claim("whole").request().build(), a_claim("s").request(cls="mig.nvidia.com").build()],
                      fleet, BUILTIN_CLASSES, ())
    assert [o.decision.state for o in outcomes] == [State.ALLOCATED, State.PENDING]


def test_incomplete_pool_is_held_back() -> None:
    only_devices = _slices()[1:]
    assert Fleet.from_slices(only_devices, {}).nodes == {}
