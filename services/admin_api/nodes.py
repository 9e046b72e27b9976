"""GET /v1/nodes: the node map's data. Every device of the fleet the process sees (the allocator's under
`up`, else the bus's) with its state: allocated (to which tenant), idle, throttled, unhealthy, or on a node
whose inventory is stale. A tenant-scoped viewer sees the fleet, and whose devices are its own, not who
holds the others.

Stale is judged as the allocator and the notifier judge it (shared/fleet/freshness.py), from when each node
was last heard, heartbeats included: under `up`, the allocator's record (`last_heard`); read from the bus,
each node's last message on the stream, which a heartbeat replaces. Not a fleet node's own observed_at in
the allocator's fleet: a heartbeat leaves that fleet as it is, so it is when the content last changed."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping

from fastapi import APIRouter, HTTPException, Request
from pydantic import Field

from services.admin_api.access import Caller, Session
from services.admin_api.fields import Model
from services.admin_api.problems import PROBLEMS
from shared.dra.inventory import THROTTLED, UNHEALTHY, Fleet, FleetDevice
from shared.fleet.freshness import iso, judge
from shared.ledger.holdings import device_holders

router = APIRouter(responses=PROBLEMS)


class DeviceCell(Model):
    name: str
    driver: str
    pool: str
    kind: str = Field(description="gpu or mig")
    parent: str | None = Field(description="a MIG slice's GPU on the same node (by its uuid)")
    state: str = Field(description="allocated, idle, throttled, unhealthy or stale")
    tenant: str | None = Field(description="who holds it (only its own tenant for a tenant-scoped viewer)")
    claim: str | None
    model: str | None
    temperature_c: int | None = Field(description="from the watcher's telemetry (NVML); none from files or Kubernetes")
    throttle_reasons: list[str] = Field(description="NVML clock event reasons, as NVML names them")


class NodeCells(Model):
    node: str
    generation: str = Field(description="architecture and product of its GPUs, what the map groups nodes by")
    stale: bool = Field(description="no inventory heard (heartbeats included) for the inventory TTL: the "
                                    "allocator places nothing new on it and the notifier raises inventory-stale")
    last_heard: str | None = Field(description="when its last inventory message (a heartbeat included) was sent, "
                                               "UTC; null when not known")
    age_seconds: float | None = Field(description="seconds since last heard, at the time of this answer")
    stale_reason: str | None = Field(description="why it is stale, as the allocator words it; null when fresh")
    labels: dict[str, str] = Field(default_factory=dict, description="its node labels (a gang topology key such "
                                   "as nvidia.com/gpu.clique among them): what the map may group nodes by")
    devices: list[DeviceCell]


@router.get("/v1/nodes", response_model=list[NodeCells], tags=["fleet"])
async def get_nodes(request: Request, s: Session, token: Caller) -> list[NodeCells]:
    """Nodes by generation, then name, each device with its state, for the page's node map. Abstract
    DynamicMIG partitions (carved only when allocated) are listed only while allocated."""
    fleet_of = getattr(request.app.state, "fleet", None)
    if fleet_of is None:
        raise HTTPException(503, "this API process has no view of the fleet (run it with the broker, or with NATS)")
    fleet = await fleet_of()
    heard = last_heard_of(request, fleet)
    ttl = float(getattr(request.app.state, "inventory_ttl", 90.0))
    held = await device_holders(s)
    now = time.time()
    out = []
    for name, node in fleet.nodes.items():
        freshness = judge(heard.get(name), now, ttl)
        stale = freshness.stale
        gpu_by_uuid = {str(d.attributes.get(UUID)): d.name for d in node.devices if _kind(d) == "gpu"}
        cells = []
        for device in node.devices:
            holder = held.get(device.key)
            kind = _kind(device)
            if holder is None and kind == "mig" and device.consumes_counters:
                continue  # a DynamicMIG placement that nobody holds is a possibility, not a device
            if holder is not None:
                state = "allocated"
            elif stale:
                state = "stale"
            else:
                state = {UNHEALTHY: "unhealthy", THROTTLED: "throttled"}.get(device.health, "idle")
            mine = holder is not None and (token.tenant is None or holder[0] == token.tenant)
            parent = device.attributes.get(PARENT_UUID)
            model = device.attributes.get(PRODUCT)
            cells.append(DeviceCell(
                name=device.name, driver=device.driver, pool=device.pool, kind=kind,
                parent=gpu_by_uuid.get(str(parent), str(parent)) if parent is not None else None, state=state,
                tenant=holder[0] if mine and holder else None, claim=holder[1] if mine and holder else None,
                model=str(model) if model is not None else None, temperature_c=device.temperature_c,
                throttle_reasons=list(device.throttle_reasons)))
        out.append(NodeCells(
            node=name, generation=_generation(node.devices), stale=stale,
            last_heard=iso(freshness.last_heard) if freshness.last_heard is not None else None,
            age_seconds=round(freshness.age, 1) if freshness.age is not None else None,
            stale_reason=freshness.reason or None, labels=dict(node.labels), devices=cells))
    out.sort(key=lambda n: (n.generation, n.node))
    return out


def last_heard_of(request: Request, fleet: Fleet) -> Mapping[str, float]:
    """The app's record of when each node was last heard (the allocator's, in its process), else the fleet's
    own times: a fleet read from the bus is each node's last message, a heartbeat's time included."""
    last_heard = getattr(request.app.state, "last_heard", None)
    heard = last_heard() if last_heard is not None else None
    return heard if heard is not None else {name: node.observed_at for name, node in fleet.nodes.items()}


UUID, PARENT_UUID = "gpu.nvidia.com/uuid", "gpu.nvidia.com/parentUUID"
PRODUCT, ARCHITECTURE = "gpu.nvidia.com/productName", "gpu.nvidia.com/architecture"


def _kind(device: FleetDevice) -> str:
    kind = device.attributes.get("gpu.nvidia.com/type")
    return str(kind) if kind is not None else "gpu"


def _generation(devices: tuple[FleetDevice, ...]) -> str:
    """The most common architecture and product among the node's devices: 'Hopper NVIDIA H100 80GB HBM3'."""
    seen = Counter(" ".join(str(d.attributes[a]) for a in (ARCHITECTURE, PRODUCT) if a in d.attributes)
                   for d in devices)
    seen.pop("", None)
    return seen.most_common(1)[0][0] if seen else "unknown"
