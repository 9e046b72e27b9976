"""Nodes run by NVIDIA's device plugin (no DRA driver) turned into the devices a DRA driver would publish.

Such a node only tells the API server `status.capacity["nvidia.com/gpu"]` and, with MIG in the mixed
strategy, `nvidia.com/mig-<profile>` counts; GPU feature discovery (GFD) adds labels for the product,
memory (MiB), GPU count and MIG strategy. That is enough to build the same ResourceSlice the topology
code builds for a fake node, so the allocator sees one kind of inventory whatever runs on the node.

What the device plugin does not say is which physical GPU holds which MIG instance: whole GPUs get the
low indices and MIG instances are packed onto the remaining GPUs with NVIDIA's placement rules, so the
device names are stable and realistic but the GPU index of a MIG device is a best guess.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from shared.fleet import topology

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
COUNT_LABEL = "nvidia.com/gpu.count"
STRATEGY_LABEL = "nvidia.com/mig.strategy"
_SINGLE_PRODUCT = re.compile(r"^(?P<gpu>.+)-MIG-(?P<profile>\d+g\.\d+gb(?:[.+]me)?)$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _count(value: Any) -> int:
    """Capacity quantities for extended resources are plain integers ("8"); anything else counts as 0."""
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def _normal(text: str) -> str:
    return text.lower().replace(" ", "-")


def product_name(label: str, model: topology.GpuModel) -> str:
    """GFD writes 'NVIDIA-H100-80GB-HBM3' where the driver says 'NVIDIA H100 80GB HBM3': use the driver's
    string when the label is that model's, else the label with spaces restored."""
    return model.product if _normal(label) == _normal(model.product) else label.replace("-", " ")


def _profile(model: topology.GpuModel, name: str) -> topology.MigProfile:
    by_name = {p.name: p for p in model.profiles}
    name = re.sub(r"\.me$", "+me", name)  # resource names cannot hold '+': 1g.10gb.me is 1g.10gb+me
    if name not in by_name:
        raise ValueError(f"{model.key} has no MIG profile {name!r}; it has {', '.join(by_name)}")
    return by_name[name]


def _fits(profiles: list[topology.MigProfile]) -> bool:
    """Whether the profiles fit together on one GPU over NVIDIA's allowed starts (biggest first)."""
    ordered = sorted(profiles, key=lambda p: -p.memory_slices)

    def place(index: int, used: frozenset[int]) -> bool:
        if index == len(ordered):
            return True
        profile = ordered[index]
        for start in profile.starts:
            span = frozenset(range(start, start + profile.memory_slices))
            if not span & used and place(index + 1, used | span):
                return True
        return False

    return place(0, frozenset())


def pack_mig(instances: list[topology.MigProfile], gpus: int) -> list[list[topology.MigProfile]]:
    """First fit, biggest first, over at least `gpus` GPUs; more GPUs when the instances need them."""
    packed: list[list[topology.MigProfile]] = [[] for _ in range(gpus)]
    for profile in sorted(instances, key=lambda p: -p.memory_slices):
        for layout in packed:
            if _fits([*layout, profile]):
                layout.append(profile)
                break
        else:
            packed.append([profile])
    return packed


def node_slices(node: str, labels: Mapping[str, str], capacity: Mapping[str, Any]) -> list[dict[str, Any]]:
    """ResourceSlice documents for a device-plugin node; [] for a node without GPUs or without GFD labels.

    Raises ValueError for a GPU model or MIG profile the broker does not know (it cannot describe it)."""
    whole = _count(capacity.get(GPU_RESOURCE))
    mig_counts = {key[len(MIG_RESOURCE_PREFIX):]: _count(value) for key, value in capacity.items()
                  if key.startswith(MIG_RESOURCE_PREFIX) and _count(value) > 0}
    label = labels.get(PRODUCT_LABEL, "")
    if (whole == 0 and not mig_counts) or not label:
        return []
    strategy = labels.get(STRATEGY_LABEL, "none")
    single = _SINGLE_PRODUCT.match(label) if strategy == "single" else None
    if single:  # every GPU in MIG mode, one profile, and nvidia.com/gpu counts MIG instances
        label, mig_counts, whole = single["gpu"], {single["profile"]: whole}, 0
    model = topology.lookup_model(label)
    instances = [_profile(model, name) for name, n in sorted(mig_counts.items()) for _ in range(n)]
    mig_gpus = max(0, _count(labels.get(COUNT_LABEL)) - whole) if instances else 0
    layouts = pack_mig(instances, mig_gpus) if instances else []
    gpu_count = whole + len(layouts)
    spec: dict[str, Any] = {
        "name": node if _DNS_LABEL.match(node) else _placeholder(node),
        "gpuModel": product_name(label, model),
        "gpuCount": gpu_count,
        "numaNodes": 1,
        "mig": {whole + i: [p.name for p in layout] for i, layout in enumerate(layouts) if layout},
    }
    slices = topology.topology_to_resource_slices({"kind": "Topology", "nodes": [spec]})
    memory = _count(labels.get(MEMORY_LABEL)) if not single else 0
    for document in slices:
        for device in document["spec"].get("devices", []):
            if memory and device["attributes"]["type"]["string"] == "gpu":
                device["capacity"]["memory"] = {"value": f"{memory}Mi"}
    if spec["name"] != node:
        slices = json.loads(json.dumps(slices).replace(spec["name"], node))
    return slices


def _placeholder(node: str) -> str:
    """Node names may be DNS subdomains (ip-10-0-0-1.ec2.internal); topology wants a label, so build with a
    unique stand-in and put the real name back afterwards."""
    return "dp-" + hashlib.sha256(node.encode()).hexdigest()[:20]
