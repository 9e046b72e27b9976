"""Fluent builders for claims and fleets, so table rows read like the scenario they test."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from shared.dra import model as dra
from shared.dra.inventory import Fleet, FleetDevice, NodeInventory
from shared.dra.quantity import Quantity


@dataclass
class ClaimBuilder:
    name: str = "claim"
    namespace: str = "team"
    requests: list[dict[str, Any]] = field(default_factory=list)
    constraints: list[dict[str, Any]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)

    def request(self, name: str = "gpu", *, cls: str = "gpu.nvidia.com", count: int | None = 1,
                selectors: tuple[str, ...] = (), mode: str = "ExactCount", **extra: Any) -> ClaimBuilder:
        body: dict[str, Any] = {"deviceClassName": cls, "allocationMode": mode, **extra}
        if count is not None and mode == "ExactCount":
            body["count"] = count
        if selectors:
            body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
        self.requests.append({"name": name, "exactly": body})
        return self

    def first_available(self, name: str, *subs: dict[str, Any]) -> ClaimBuilder:
        self.requests.append({"name": name, "firstAvailable": list(subs)})
        return self

    def match(self, attribute: str, *requests: str) -> ClaimBuilder:
        self.constraints.append({"matchAttribute": attribute, **({"requests": list(requests)} if requests else {})})
        return self

    def distinct(self, attribute: str, *requests: str) -> ClaimBuilder:
        self.constraints.append({"distinctAttribute": attribute, **({"requests": list(requests)} if requests else {})})
        return self

    def gang(self, name: str, size: int | str, *, topology: str | None = None, mode: str | None = None,
             wait: str | None = None) -> ClaimBuilder:
        """The claimbroker.io gang annotations (size as written: a string is kept verbatim)."""
        self.annotations["claimbroker.io/gang"] = name
        self.annotations["claimbroker.io/gang-size"] = str(size)
        for key, value in (("gang-topology", topology), ("gang-topology-mode", mode), ("gang-topology-wait", wait)):
            if value is not None:
                self.annotations[f"claimbroker.io/{key}"] = value
        return self

    def document(self) -> dict[str, Any]:
        return {
            "apiVersion": dra.API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {"name": self.name, "namespace": self.namespace, "annotations": self.annotations},
            "spec": {"devices": {"requests": self.requests, "constraints": self.constraints}},
        }

    def build(self) -> dra.ResourceClaim:
        return dra.parse_claim(self.document())


def a_claim(name: str = "claim", namespace: str = "team") -> ClaimBuilder:
    return ClaimBuilder(name=name, namespace=namespace)


MEMORY = {"A100-40GB": "40960Mi", "A100": "81920Mi", "H100": "81559Mi", "H200": "143771Mi", "B200": "183359Mi"}


def gpu(node: str, index: int, model: str = "H100", *, numa: int = 0, taints: tuple[dict[str, str], ...] = (),
        **attributes: Any) -> FleetDevice:
    attrs: dict[str, Any] = {
        "gpu.nvidia.com/type": "gpu",
        "gpu.nvidia.com/productName": model,
        "gpu.nvidia.com/numa-node": numa,
        "gpu.nvidia.com/uuid": f"GPU-{node}-{index}",
    }
    attrs.update({k if "/" in k else f"gpu.nvidia.com/{k}": v for k, v in attributes.items()})
    return FleetDevice(
        node=node, driver="gpu.nvidia.com", pool=node, name=f"gpu-{index}", attributes=attrs,
        capacity={"gpu.nvidia.com/memory": Quantity(MEMORY.get(model, "81559Mi"))},
        taints=tuple(dra.DeviceTaint.model_validate(t) for t in taints),
    )


def fleet(*devices: FleetDevice) -> Fleet:
    by_node: dict[str, list[FleetDevice]] = {}
    for d in devices:
        by_node.setdefault(d.node, []).append(d)
    return Fleet({n: NodeInventory(node=n, devices=tuple(ds)) for n, ds in by_node.items()})


def node(name: str, model: str, count: int, *, numa_nodes: int = 1) -> list[FleetDevice]:
    return [gpu(name, i, model, numa=i * numa_nodes // count) for i in range(count)]


def labelled(f: Fleet, labels: dict[str, dict[str, str]]) -> Fleet:
    """The fleet with node labels (node -> label -> value) added to its nodes."""
    return Fleet({n: replace(inv, labels={**inv.labels, **labels.get(n, {})}) for n, inv in f.nodes.items()})
