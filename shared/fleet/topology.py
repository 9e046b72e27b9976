"""Topology documents (in the spirit of fake-gpu-operator) turned into the ResourceSlices that NVIDIA's
DRA driver (gpu.nvidia.com) would publish: same attribute names, types, capacities and device names.

`gpuModel` becomes `productName` verbatim, as in fake-gpu-operator; architecture, memory, compute
capability and MIG geometry come from the known model it names (case-insensitive substring match).
A `mig` layout per GPU gives static MIG devices (as mig-parted carves them), or with `dynamic` NVIDIA's
DynamicMIG form: every placement of every profile, drawing on the GPU's shared counters.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from shared.dra import model as dra
from shared.dra.names import label_value_problem, qualified_name_problem

DRIVER = "gpu.nvidia.com"
DRIVER_VERSION = "580.105.8"
CUDA_DRIVER_VERSION = "13.0.0"


@dataclass(frozen=True)
class MigProfile:
    name: str  # e.g. "1g.10gb"
    gi_profile_id: int
    memory_slices: int
    starts: tuple[int, ...]
    multiprocessors: int
    memory_mi: int
    engines: tuple[int, int, int, int, int]  # copy engines, decoders, encoders, JPEG, OFA

    @property
    def device_token(self) -> str:
        """'3g.40gb' -> '3g40gb', '1g.10gb+me' -> '1g10gbme': device names are DNS labels."""
        return re.sub(r"[^a-z0-9]", "", self.name)


@dataclass(frozen=True)
class GpuModel:
    key: str
    product: str
    architecture: str
    compute_capability: str
    memory: str
    profiles: tuple[MigProfile, ...]

    @property
    def whole(self) -> MigProfile:
        """The 7g profile: what the full GPU holds, so its counters are the counter set's totals."""
        return self.profiles[-1]


# (GI profile id, memory slices, allowed starts) per profile shape; placements are NVIDIA's (dra.md 5.5).
_SHAPES = (("1g", 19, 1, (0, 1, 2, 3, 4, 5, 6)), ("1g", 20, 1, (0, 1, 2, 3, 4, 5, 6)),
           ("1g", 15, 2, (0, 2, 4, 6)), ("2g", 14, 2, (0, 2, 4)), ("3g", 9, 4, (0, 4)), ("4g", 5, 4, (0,)),
           ("7g", 0, 8, (0,)))
# Copy engines, decoders, encoders, JPEG and OFA per shape, from NVIDIA's MIG user guide tables.
_AMPERE_ENGINES = ((1, 0, 0, 0, 0), (1, 1, 0, 1, 1), (1, 1, 0, 0, 0), (2, 1, 0, 0, 0), (3, 2, 0, 0, 0),
                   (4, 2, 0, 0, 0), (7, 5, 0, 1, 1))
_HOPPER_ENGINES = ((1, 1, 0, 1, 0), (1, 1, 0, 1, 1), (1, 1, 0, 1, 0), (2, 2, 0, 2, 0), (3, 3, 0, 3, 0),
                   (4, 4, 0, 4, 0), (8, 7, 0, 7, 1))


def _profiles(sizes: tuple[int, int, int, int, int, int], sms: tuple[int, int, int, int, int, int],
              memory_mi: tuple[int, int, int, int, int, int],
              engines: tuple[tuple[int, int, int, int, int], ...] = _HOPPER_ENGINES) -> tuple[MigProfile, ...]:
    """Names from sizes in GB for 1g, 1g(2 slices), 2g, 3g, 4g, 7g; the 1g+me profile mirrors 1g."""
    def widen(values: tuple[int, ...]) -> tuple[int, ...]:
        return (values[0], values[0], *values[1:])

    names = [f"1g.{sizes[0]}gb", f"1g.{sizes[0]}gb+me", f"1g.{sizes[1]}gb", f"2g.{sizes[2]}gb",
             f"3g.{sizes[3]}gb", f"4g.{sizes[4]}gb", f"7g.{sizes[5]}gb"]
    return tuple(
        MigProfile(name, gi, slices, starts, sm, mem, engine)
        for name, (_, gi, slices, starts), sm, mem, engine in zip(
            names, _SHAPES, widen(sms), widen(memory_mi), engines, strict=True)
    )


_HOPPER_SM = (16, 26, 32, 60, 64, 132)
GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("A100-40GB", "NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", "40960Mi",
             _profiles((5, 10, 10, 20, 20, 40), (14, 14, 28, 42, 56, 98), (4864, 9856, 9856, 19968, 19968, 40192),
                       _AMPERE_ENGINES)),
    GpuModel("A100", "NVIDIA A100-SXM4-80GB", "Ampere", "8.0.0", "81920Mi",
             _profiles((10, 20, 20, 40, 40, 80), (14, 14, 28, 42, 56, 98), (9856, 19968, 19968, 40192, 40192, 80384),
                       _AMPERE_ENGINES)),
    GpuModel("H100", "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "81559Mi",
             _profiles((10, 20, 20, 40, 40, 80), _HOPPER_SM, (9984, 20096, 20096, 40448, 40448, 81152))),
    GpuModel("H200", "NVIDIA H200", "Hopper", "9.0.0", "143771Mi",
             _profiles((18, 35, 35, 71, 71, 141), _HOPPER_SM, (16640, 32896, 32896, 65920, 65920, 143360))),
    GpuModel("B200", "NVIDIA B200", "Blackwell", "10.0.0", "183359Mi",
             _profiles((23, 45, 45, 90, 90, 180), (18, 36, 36, 72, 72, 148),
                       (23040, 45056, 45056, 90112, 90112, 182272))),
    GpuModel("B300", "NVIDIA B300 SXM6 AC", "Blackwell", "10.3.0", "275040Mi",
             _profiles((34, 67, 67, 135, 135, 269), (18, 36, 36, 72, 72, 148),
                       (34304, 68352, 68352, 137472, 137472, 274432))),
)


def lookup_model(gpu_model: str) -> GpuModel:
    """'H100', 'h100-sxm' and 'NVIDIA H100 80GB HBM3' are all Hopper 80GB; A100 40GB before plain A100."""
    text = gpu_model.lower().replace(" ", "-")
    if "a100" in text and "40gb" in text:
        return GPU_MODELS[0]
    for model in sorted(GPU_MODELS[1:], key=lambda m: -len(m.key)):
        if model.key.lower() in text:
            return model
    known = ", ".join(m.key for m in GPU_MODELS)
    raise ValueError(f"gpuModel {gpu_model!r} is not a known GPU; known models: {known}")


def _uuid(prefix: str, *parts: object) -> str:
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_DNS, '/'.join(map(str, parts)))}"


def _node_names(spec: dict[str, Any], index: int) -> list[str]:
    if "name" in spec:
        return [str(spec["name"])]
    prefix, count = spec.get("namePrefix"), spec.get("count", 1)
    if not prefix:
        raise ValueError(f"nodes[{index}]: set name, or namePrefix and count")
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"nodes[{index}].count: must be a positive integer, got {count!r}")
    return [f"{prefix}{i + 1:02d}" for i in range(count)]


DYNAMIC = "dynamic"


def _layout(value: Any, model: GpuModel, where: str) -> list[MigProfile]:
    by_name = {p.name: p for p in model.profiles}
    if isinstance(value, str):
        if value == "all-balanced":  # mig-parted's preset: 2 x 1g, 1 x 2g, 1 x 3g
            names = [model.profiles[0].name] * 2 + [model.profiles[3].name, model.profiles[4].name]
        elif value.startswith("all-") and value[4:] in by_name:
            profile = by_name[value[4:]]
            names = [profile.name] * (1 if profile.name.endswith("+me") else len(profile.starts))
        else:
            raise ValueError(f"{where}: unknown MIG layout {value!r}; use all-<profile>, all-balanced, "
                             f"{DYNAMIC} or a list")
    elif isinstance(value, list):
        names = [str(v) for v in value]
    else:
        raise ValueError(f"{where}: a MIG layout is a list of profiles, all-<profile> or {DYNAMIC}")
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"{where}: {model.key} has no MIG profile {unknown[0]!r}; it has {', '.join(by_name)}")
    return [by_name[n] for n in names]


def carved(layout: str | list[str], model: GpuModel) -> list[MigProfile]:
    """The MIG devices a layout (all-<profile>, all-balanced or a list) carves on one GPU of `model`, as
    this source carves them: NVIDIA's valid placements, or a ValueError."""
    return [profile for profile, _ in _place(_layout(layout, model, "layout"), "layout")]


def _place(profiles: list[MigProfile], where: str) -> list[tuple[MigProfile, int]]:
    """Biggest profile first over NVIDIA's allowed starts, backtracking when a later one cannot fit
    (all-balanced on an H100 needs 3g at 4 and 2g at 0, not 3g at 0)."""
    ordered = sorted(profiles, key=lambda p: -p.memory_slices)

    def place(index: int, used: frozenset[int]) -> list[tuple[MigProfile, int]] | None:
        if index == len(ordered):
            return []
        profile = ordered[index]
        for start in profile.starts:
            span = frozenset(range(start, start + profile.memory_slices))
            if not span & used and (rest := place(index + 1, used | span)) is not None:
                return [(profile, start), *rest]
        return None

    placed = place(0, frozenset())
    if placed is None:
        names = ", ".join(p.name for p in ordered)
        raise ValueError(f"{where}: the MIG layout {names} does not fit on one GPU")
    return sorted(placed, key=lambda item: item[1])


_ENGINE_NAMES = ("copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
_ENGINE_COUNTERS = ("copy-engines", "decoders", "encoders", "jpeg-engines", "ofa-engines")


def _mig_capacity(profile: MigProfile, start: int) -> dict[str, Any]:
    """What NVIDIA's driver publishes for a MIG device: SMs, engines, memory and its memory slices."""
    capacity: dict[str, Any] = {"multiprocessors": {"value": str(profile.multiprocessors)}}
    capacity.update({name: {"value": str(n)} for name, n in zip(_ENGINE_NAMES, profile.engines, strict=True)})
    capacity["memory"] = {"value": f"{profile.memory_mi}Mi"}
    for s in range(start, start + profile.memory_slices):
        capacity[f"memorySlice{s}"] = {"value": "1"}
    return capacity


def _counters(profile: MigProfile, start: int, slices: int) -> dict[str, Any]:
    """DynamicMIG counters a placement consumes; the 7g profile at 0 gives the counter set's totals."""
    counters: dict[str, Any] = {"multiprocessors": {"value": str(profile.multiprocessors)}}
    counters.update({name: {"value": str(n)} for name, n in zip(_ENGINE_COUNTERS, profile.engines, strict=True)})
    counters["memory"] = {"value": f"{profile.memory_mi}Mi"}
    counters.update({f"memory-slice-{s}": {"value": "1"} for s in range(start, start + slices)})
    return counters


def _mig_device(node: str, i: int, profile: MigProfile, start: int, gpu_uuid: str, common: dict[str, Any],
                dynamic: bool) -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": "mig"}}
    if not dynamic:  # an abstract DynamicMIG partition has no MIG UUID until it is created
        attributes["uuid"] = {"string": _uuid("MIG", node, i, profile.name, start)}
    attributes.update({"parentUUID": {"string": gpu_uuid}, "profile": {"string": profile.name}, **common})
    device: dict[str, Any] = {
        "name": f"gpu-{i}-mig-{profile.device_token}-{profile.gi_profile_id}-{start}",
        "attributes": attributes,
        "capacity": _mig_capacity(profile, start),
    }
    if dynamic:
        device["consumesCounters"] = [{"counterSet": f"gpu-{i}-counter-set",
                                       "counters": _counters(profile, start, profile.memory_slices)}]
    return device


def _node_slices(node: str, spec: dict[str, Any], model: GpuModel) -> list[dict[str, Any]]:
    """One slice for full GPUs and static MIG; with DynamicMIG, NVIDIA's Kubernetes 1.35+ layout: one
    slice of counter sets plus one device slice per GPU, all in one pool (G+1 slices)."""
    count = spec.get("gpuCount", 0)
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"node {node}: gpuCount must be a non-negative integer, got {count!r}")
    numa_nodes = spec.get("numaNodes", 1)
    if not isinstance(numa_nodes, int) or numa_nodes < 1:
        raise ValueError(f"node {node}: numaNodes must be at least 1, got {numa_nodes!r}")
    raw_mig = spec.get("mig") or {}
    if raw_mig == DYNAMIC:
        raw_mig = {g: DYNAMIC for g in range(count)}
    if not isinstance(raw_mig, dict):
        raise ValueError(f"node {node}: mig is a map of GPU index to layout, or {DYNAMIC!r}")
    mig = {int(k): v for k, v in raw_mig.items()}
    for gpu_index in mig:
        if not 0 <= gpu_index < count:
            raise ValueError(f"node {node}: mig names GPU {gpu_index}, but the node has {count} GPUs")
    per_gpu: list[list[dict[str, Any]]] = []
    counter_sets = []
    for i in range(count):
        gpu_uuid = _uuid("GPU", node, i)
        common: dict[str, Any] = {
            "productName": {"string": str(spec["gpuModel"])},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": model.architecture},
            "cudaComputeCapability": {"version": model.compute_capability},
            "driverVersion": {"version": DRIVER_VERSION},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
            "numa-node": {"int": i * numa_nodes // count},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x10 + 0x11 * i:02x}"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + 0x11 * i:02x}:00.0"},
        }
        full: dict[str, Any] = {
            "name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu_uuid}, **common},
            "capacity": {"memory": {"value": model.memory}}}
        if mig.get(i) == DYNAMIC:
            counter_set = f"gpu-{i}-counter-set"
            counter_sets.append({"name": counter_set, "counters": _counters(model.whole, 0, 8)})
            full["consumesCounters"] = [{"counterSet": counter_set, "counters": _counters(model.whole, 0, 8)}]
            partitions = [_mig_device(node, i, p, start, gpu_uuid, common, dynamic=True)
                          for p in model.profiles for start in p.starts]
            per_gpu.append([full, *sorted(partitions, key=lambda d: d["name"])])
        elif i in mig:
            where = f"node {node}: mig[{i}]"
            per_gpu.append([_mig_device(node, i, p, start, gpu_uuid, common, dynamic=False)
                            for p, start in _place(_layout(mig[i], model, where), where)])
        else:
            per_gpu.append([full])

    def slice_doc(name: str, total: int, **spec_fields: Any) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
                "spec": {"driver": DRIVER, "nodeName": node,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": total}, **spec_fields}}

    if not counter_sets:
        return [slice_doc(f"{node}-{DRIVER}", 1, devices=[d for devices in per_gpu for d in devices])]
    total = count + 1
    return [slice_doc(f"{node}-{DRIVER}-counters", total, sharedCounters=counter_sets)] + [
        slice_doc(f"{node}-{DRIVER}-gpu-{i}", total, devices=devices) for i, devices in enumerate(per_gpu)]


def _nodes(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any], int]]:
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        raise ValueError("nodes: a Topology needs a list of nodes")
    out, seen = [], set()
    for index, spec in enumerate(nodes):
        if not isinstance(spec, dict):
            raise ValueError(f"nodes[{index}]: expected a mapping")
        for name in _node_names(spec, index):
            if not dra.is_dns_subdomain(name):  # `gpu-1.example.com` too: its subject writes '.' as '_'
                raise ValueError(f"nodes[{index}].name: {dra.shown(name)} {dra.DNS_SUBDOMAIN_RULE}, as Kubernetes "
                                 "requires of a node's name")
            if name in seen:
                raise ValueError(f"nodes[{index}].name: node {name!r} is listed twice")
            seen.add(name)
            out.append((name, spec, index))
    return out


def topology_to_resource_slices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One ResourceSlice per node with GPUs; nodes without GPUs publish none."""
    slices = []
    for name, spec, index in _nodes(doc):
        if "gpuModel" not in spec:
            raise ValueError(f"nodes[{index}].gpuModel: required")
        model = lookup_model(str(spec["gpuModel"]))
        if spec.get("gpuCount", 0):
            slices.extend(_node_slices(name, spec, model))
    return slices


@dataclass(frozen=True)
class LabelGroup:
    """`groupLabels: {KEY: {every: N, prefix: P, start: S}}` on a node entry: its nodes, in order, get KEY's
    value per group of N (racks, NVLink cliques): P and the group's number from S, two digits as node
    names have (P01 for the first N nodes, P02 for the next, ...)."""

    every: int
    prefix: str = ""
    start: int = 1

    def value(self, position: int) -> str:
        return f"{self.prefix}{self.start + position // self.every:02d}"


_GROUP_FIELDS = ("every", "prefix", "start")


def _label_groups(raw: Any, where: str) -> dict[str, LabelGroup]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a map of label key to {{every: N, prefix: P}}")
    groups = {}
    for key, spec in raw.items():
        at = f"{where}[{key}]"
        if (problem := qualified_name_problem(str(key))) is not None:
            raise ValueError(f"{where}: key {dra.shown(str(key))} {problem}")
        if not isinstance(spec, dict):
            raise ValueError(f"{at}: expected {{every: N, prefix: P}} (N nodes share each value)")
        unknown = sorted(str(k) for k in spec if k not in _GROUP_FIELDS)
        if unknown:
            raise ValueError(f"{at}.{unknown[0]}: unknown field (it takes every, prefix and start)")
        every, prefix, start = spec.get("every"), spec.get("prefix", ""), spec.get("start", 1)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"{at}.every: how many nodes share a value, a positive integer, got {dra.shown(every)}")
        if not isinstance(prefix, str):
            raise ValueError(f"{at}.prefix: must be a string, got {dra.shown(prefix)}")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"{at}.start: the first group's number, a non-negative integer, got {dra.shown(start)}")
        groups[str(key)] = LabelGroup(every, prefix, start)
    return groups


def _label_value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str | int | float):
        text = str(value)
    else:
        raise ValueError(f"{where}: {dra.shown(value)} is not a label value (a string)")
    if (problem := label_value_problem(text)) is not None:
        raise ValueError(f"{where}: {dra.shown(text)} {problem}")
    return text


def _own_labels(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a map of label key to value")
    labels = {}
    for key, value in raw.items():
        if (problem := qualified_name_problem(str(key))) is not None:
            raise ValueError(f"{where}: key {dra.shown(str(key))} {problem}")
        labels[str(key)] = _label_value(value, f"{where}[{key}]")
    return labels


def topology_node_labels(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each node's labels, as Kubernetes node labels: its entry's `nodeLabels`, and per `groupLabels` key
    its group's value (`LabelGroup`), so that the nodes of one `namePrefix`/`count` entry fall into racks
    or cliques the core can group by."""
    out: dict[str, dict[str, str]] = {}
    entries: dict[int, tuple[dict[str, str], dict[str, LabelGroup]]] = {}
    position: dict[int, int] = {}
    for name, spec, index in _nodes(doc):
        if index not in entries:
            own = _own_labels(spec.get("nodeLabels"), f"nodes[{index}].nodeLabels")
            groups = _label_groups(spec.get("groupLabels"), f"nodes[{index}].groupLabels")
            if both := sorted(own.keys() & groups.keys()):
                raise ValueError(f"nodes[{index}].groupLabels[{both[0]}]: also in nodeLabels; give it in one")
            entries[index] = own, groups
        own, groups = entries[index]
        n = position[index] = position.get(index, -1) + 1
        labels = dict(own)
        for key, group in groups.items():
            labels[key] = _label_value(group.value(n), f"nodes[{index}].groupLabels[{key}]")
        out[name] = labels
    return out
