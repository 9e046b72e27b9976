"""GET /v1/nodes: the node map's data. Every device of the fleet the process sees (the allocator's under
`up`, else the bus's) with its state: allocated (to which tenant), idle, throttled, unhealthy, or on a node
whose inventory is stale. A tenant-scoped viewer sees the fleet, and whose devices are its own, not who
holds the others."""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request
from pydantic import Field
from sqlalchemy import select

from services.admin_api.common import PROBLEMS, Caller, Model, Session
from shared.dra.inventory import THROTTLED, UNHEALTHY
from shared.ledger.schema import Claim, DeviceAllocation

router = APIRouter(responses=PROBLEMS)


class DeviceCell(Model):
    name: str
    kind: str = Field(description="gpu or mig")
    state: str = Field(description="allocated, idle, throttled, unhealthy or stale")
    tenant: str | None = Field(description="who holds it (only its own tenant for a tenant-scoped viewer)")
    claim: str | None
    model: str | None


class NodeCells(Model):
    node: str
    devices: list[DeviceCell]


@router.get("/v1/nodes", response_model=list[NodeCells], tags=["fleet"])
async def get_nodes(request: Request, s: Session, token: Caller) -> list[NodeCells]:
    """Nodes in name order, each device with its state, for the page's node map."""
    fleet_of = getattr(request.app.state, "fleet", None)
    if fleet_of is None:
        raise HTTPException(503, "this API process has no view of the fleet (run it with the broker, or with NATS)")
    fleet = await fleet_of()
    ttl = float(getattr(request.app.state, "inventory_ttl", 90.0))
    held = {(driver, pool, device): (tenant, name) for driver, pool, device, tenant, name in await s.execute(
        select(DeviceAllocation.driver, DeviceAllocation.pool, DeviceAllocation.device, Claim.namespace, Claim.name)
        .join(Claim, Claim.id == DeviceAllocation.claim_id))}
    now = time.time()
    out = []
    for name in sorted(fleet.nodes):
        node = fleet.nodes[name]
        stale = bool(node.observed_at) and now - node.observed_at > ttl
        cells = []
        for device in node.devices:
            holder = held.get(device.key)
            if holder is not None:
                state = "allocated"
            elif stale:
                state = "stale"
            else:
                state = {UNHEALTHY: "unhealthy", THROTTLED: "throttled"}.get(device.health, "idle")
            mine = holder is not None and (token.tenant is None or holder[0] == token.tenant)
            kind = device.attributes.get("gpu.nvidia.com/type")
            model = device.attributes.get("gpu.nvidia.com/productName")
            cells.append(DeviceCell(name=device.name, kind=str(kind) if kind is not None else "gpu", state=state,
                                    tenant=holder[0] if mine and holder else None,
                                    claim=holder[1] if mine and holder else None,
                                    model=str(model) if model is not None else None))
        out.append(NodeCells(node=name, devices=cells))
    return out
