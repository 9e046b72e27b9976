"""POST /v1/whatif (admins): the live ledger and fleet with proposed changes, decided by the same core as
the allocator (shared/admission/whatif.py), nothing written. The fleet comes from the process's view of
the bus: the allocator's when it runs beside the API (`up`), else every node's last inventory message."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import Field

from services.admin_api.common import PROBLEMS, Caller, Input, Session, admin
from shared.admission.quota import QuotaFileError, parse_quotas
from shared.admission.whatif import Change, what_if
from shared.contract.events import node_inventories
from shared.dra import model as dra
from shared.dra.cel import SelectorError, compile_selector
from shared.dra.classes import merge_classes
from shared.fleet.sources import InventoryFileError, documents_from
from shared.ledger.claims_read import read_claims
from shared.ledger.quota_store import load_quota_config

router = APIRouter(responses=PROBLEMS)


class WhatIfIn(Input):
    quotas: dict[str, Any] | None = Field(default=None, description="a whole proposed Quotas document")
    add_inventory: list[dict[str, Any]] = Field(default_factory=list, max_length=10_000, description=(
        "Topology documents or ResourceSlices (with DeviceClasses) of nodes to add"))
    drain: list[str] = Field(default_factory=list, max_length=10_000, description="nodes to take away")
    remove_tenants: list[str] = Field(default_factory=list, max_length=10_000)


@router.post("/v1/whatif", tags=["whatif"], response_model=dict[str, Any])
async def post_whatif(body: WhatIfIn, request: Request, s: Session, token: Caller) -> dict[str, Any]:
    """Who would be admitted, preempted (with the rule, or drain) or beyond a cut quota, and each tenant's
    devices per flavor, share and waiting claims, now and after."""
    admin(token)
    fleet_of = getattr(request.app.state, "fleet", None)
    if fleet_of is None:
        raise HTTPException(503, "this API process has no view of the fleet (run it with the broker, or with NATS)")
    fleet = await fleet_of()
    unknown = sorted(set(body.drain) - set(fleet.nodes))
    if unknown:
        raise HTTPException(422, f"no node {', '.join(unknown)} in the fleet")
    try:
        proposed = parse_quotas(body.quotas, where="quotas") if body.quotas is not None else None
        for i, flavor in enumerate(proposed.listed_flavors if proposed is not None else ()):
            try:
                compile_selector(flavor.selector)
            except SelectorError as error:
                raise QuotaFileError(f"quotas.flavors[{i}].selector: {error}") from None
        added = documents_from(body.add_inventory, "addInventory") if body.add_inventory else None
    except (QuotaFileError, InventoryFileError, dra.DocumentError) as error:
        raise HTTPException(422, str(error)) from None
    nodes = node_inventories(added.slices, added.labels, observed_at=time.time()) if added is not None else ()
    running, waiting, documents = await read_claims(s)
    config = await load_quota_config(s)
    change = Change(quotas=proposed, add_nodes=nodes, drain=frozenset(body.drain),
                    remove_tenants=frozenset(body.remove_tenants))
    classes = merge_classes(added.classes if added is not None else [])
    answer = await asyncio.to_thread(what_if, fleet, classes, config, running, waiting, documents, change)
    return answer.to_json()
