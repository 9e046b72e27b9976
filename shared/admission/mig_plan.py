"""A MIG re-layout planned from what waits: static layouts drift from demand (slices idle on one GPU while
claims wait for a profile nobody carved). Only GPUs where nothing runs are re-laid (an idle whole GPU, or
one whose slices are all idle), each within NVIDIA's valid placements for its model (the topology's); a
running slice never moves. GPUs are taken one at a time, each given the layout under which the decision core
admits the most waiting claims (the GPU units they get break ties), with what earlier GPUs were given; a
layout that admits no more claims leaves the GPU as it is, so nothing is re-laid for nothing.

Nodes are read back into the topology's form (GPUs `gpu-<i>`, slices `gpu-<i>-mig-...`, as the topology
source and NVIDIA's driver name them); a node in another form, or with DynamicMIG GPUs (partitions made on
demand, nothing to plan), is left out."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shared.admission.cycle import run_cycle
from shared.admission.flavors import Flavors
from shared.admission.kept import KeptState
from shared.admission.model import ClaimKey, Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.contract.events import node_inventories
from shared.dra import model as dra
from shared.dra.inventory import Fleet, FleetDevice, NodeInventory
from shared.fleet.topology import DRIVER, GpuModel, carved, lookup_model, topology_to_resource_slices

MAX_GPUS = 64  # GPUs weighed per plan, the nodes' first in name order: a plan's cost is GPUs x layouts cycles
_NAME = re.compile(r"^gpu-(\d+)(?:-mig-.*)?$")
WHOLE = "whole"


@dataclass(frozen=True)
class GpuLayout:
    node: str
    gpu: int
    model: str
    now: str  # "whole", or the profiles now carved, sorted
    planned: str  # "whole", "all-<profile>", or "all-balanced"


@dataclass
class MigPlan:
    layouts: list[GpuLayout] = field(default_factory=list)  # only GPUs whose layout changes
    admits: list[ClaimKey] = field(default_factory=list)  # waiting claims admitted with the plan
    units: float = 0.0  # GPU units the admitted claims would get
    without: list[ClaimKey] = field(default_factory=list)  # those admitted as the GPUs are
    nodes: dict[str, NodeInventory] = field(default_factory=dict)  # the changed nodes as the plan lays them

    @property
    def gained(self) -> list[ClaimKey]:
        """What the re-layout admits that the GPUs as they are would not."""
        kept = set(self.without)
        return [k for k in self.admits if k not in kept]

    def to_json(self) -> dict[str, Any]:
        return {"layouts": [{"node": g.node, "gpu": g.gpu, "model": g.model, "now": g.now, "planned": g.planned}
                            for g in self.layouts],
                "admits": ["/".join(k) for k in self.admits], "gained": ["/".join(k) for k in self.gained],
                "units": round(self.units, 3),
                "migParted": self.mig_parted()}

    def mig_parted(self) -> dict[str, Any]:
        """The plan as a mig-parted config: one named config per node, its GPUs in the planned layout (a
        node's other GPUs are as they are; apply a node's config with its GPUs drained)."""
        configs: dict[str, list[dict[str, Any]]] = {}
        for g in self.layouts:
            entry: dict[str, Any] = {"devices": [g.gpu]}
            if g.planned == WHOLE:
                entry["mig-enabled"] = False
            else:
                entry["mig-enabled"] = True
                entry["mig-devices"] = _mig_devices(g.model, g.planned)
            configs.setdefault(f"claimbroker-{g.node}", []).append(entry)
        return {"version": "v1", "mig-configs": configs}


@dataclass(frozen=True)
class _Node:
    """A node in the topology's form: what regenerating it with other layouts needs."""

    name: str
    model: GpuModel
    product: str
    count: int
    numa_nodes: int
    labels: Mapping[str, str]
    layouts: Mapping[int, tuple[str, ...]]  # per MIG GPU, its profiles; a GPU not in it is whole

    def inventory(self, layouts: Mapping[int, str | tuple[str, ...]]) -> NodeInventory:
        mig = {i: list(p) if isinstance(p, tuple) else p for i, p in layouts.items() if p != WHOLE}
        spec = {"name": self.name, "gpuModel": self.product, "gpuCount": self.count, "numaNodes": self.numa_nodes,
                "mig": mig}
        slices = [dra.ResourceSlice.model_validate(s)
                  for s in topology_to_resource_slices({"kind": "Topology", "nodes": [spec]})]
        (inventory,) = node_inventories(slices, {self.name: self.labels}, observed_at=0.0)
        return inventory


def _read_node(inventory: NodeInventory) -> _Node | None:
    """The node in the topology's form, or None when it is not in it."""
    profiles: dict[int, list[str]] = {}
    whole: set[int] = set()
    product, numa = None, 0
    for device in inventory.devices:
        match = _NAME.match(device.name)
        if match is None or device.consumes_counters or device.driver != DRIVER:  # another naming, or DynamicMIG
            return None
        index = int(match[1])
        product = product or _attribute(device, "productName")
        numa = max(numa, int(_attribute(device, "numa-node") or 0))
        if _attribute(device, "type") == "mig":
            profiles.setdefault(index, []).append(str(_attribute(device, "profile") or ""))
        else:
            whole.add(index)
    if product is None or not (whole or profiles):
        return None
    try:
        model = lookup_model(str(product))
    except ValueError:
        return None
    count = max([*whole, *profiles]) + 1
    return _Node(inventory.node, model, str(product), count, numa + 1, dict(inventory.labels),
                 {i: tuple(sorted(p)) for i, p in profiles.items()})


def _attribute(device: FleetDevice, name: str) -> Any:
    return device.attributes.get(f"{DRIVER}/{name}")


def _options(model: GpuModel) -> list[str]:
    """The layouts weighed for a GPU: whole, every profile alone (as many as fit), and all-balanced."""
    profiles = [p.name for p in model.profiles if not p.name.endswith("+me") and not p.name.startswith("7g")]
    return [WHOLE, *(f"all-{name}" for name in profiles), "all-balanced"]


def _mig_devices(model_key: str, layout: str) -> dict[str, int]:
    """mig-parted's form of a layout: how many devices of each profile."""
    return dict(Counter(profile.name for profile in carved(layout, lookup_model(model_key))))


def plan_mig(fleet: Fleet, classes: Mapping[str, dra.DeviceClass], quotas: QuotaConfig,
             running: Iterable[Running], waiting: Iterable[Waiting]) -> MigPlan:
    """The re-layout of idle GPUs that admits the most of `waiting` (GPU units break ties); running
    claims keep their devices (none is preempted to make room)."""
    held = [replace(r, preemptible=False) for r in running]  # a plan moves nothing that runs
    queue = tuple(sorted(waiting, key=lambda w: (w.arrival, w.key)))
    busy = {(r.allocation.node, key[2]) for r in held for key in r.allocation.keys}
    values = {f.name: f.value for f in quotas.flavors}
    memo = KeptState().memo  # selector results per distinct device attributes: the same for every trial
    flavors = Flavors(quotas.flavors, memo)

    def score(candidate: Fleet) -> tuple[float, list[ClaimKey]]:
        result = run_cycle(Snapshot(candidate, classes, quotas, tuple(held), queue), KeptState(memo))
        admitted = sorted((d.tenant, d.name) for d in result.decisions if d.decision.allocation is not None)
        units = 0.0
        for d in result.decisions:
            for key in d.decision.allocation.keys if d.decision.allocation is not None else ():
                device = candidate.by_key.get(key)
                name = flavors.name_of(device) if device is not None else None
                units += values.get(name, 1.0) if name is not None else 1.0
        return units, admitted

    nodes = {name: node for name in sorted(fleet.nodes) if (node := _read_node(fleet.nodes[name])) is not None}
    current: dict[str, dict[int, str | tuple[str, ...]]] = {
        name: {i: node.layouts.get(i, WHOLE) for i in range(node.count)} for name, node in nodes.items()}
    inventories = dict(fleet.nodes)
    best_units, best_admits = score(fleet)
    as_they_are = best_admits
    weighed = 0
    for name, node in nodes.items():
        for gpu in range(node.count):
            if weighed == MAX_GPUS or _busy(busy, name, gpu):
                continue
            weighed += 1
            base = len(best_admits)  # a layout of this GPU must admit more than this to be chosen
            for option in _options(node.model):
                if option == current[name][gpu]:
                    continue
                trial = {**current[name], gpu: option}
                units, admits = score(Fleet({**inventories, name: node.inventory(trial)}))
                if len(admits) > base and (len(admits), units) > (len(best_admits), best_units):
                    best_units, best_admits = units, admits
                    current[name] = trial
                    inventories[name] = node.inventory(trial)
    plan = MigPlan(admits=best_admits, units=best_units, without=as_they_are)
    for name, node in nodes.items():
        for gpu in range(node.count):
            before, after = node.layouts.get(gpu, WHOLE), current[name][gpu]
            if before != after:
                now = WHOLE if before == WHOLE else ",".join(before)
                plan.layouts.append(GpuLayout(name, gpu, node.model.key, now, str(after)))
                plan.nodes[name] = inventories[name]
    return plan


def _busy(busy: set[tuple[str, str]], node: str, gpu: int) -> bool:
    """Whether a running claim holds the GPU or one of its slices."""
    prefix, whole = f"gpu-{gpu}-", f"gpu-{gpu}"
    return any(n == node and (d == whole or d.startswith(prefix)) for n, d in busy)
