"""POST /v1/whatif (admins): the live ledger and fleet with proposed changes, decided by the same core as
the allocator (shared/admission/whatif.py), nothing written.

The work runs in a worker process beside the allocator (services/admin_api/offload.py): the body is handed
to it unparsed, and it reads the ledger and, under `up` or with NATS, every node's last inventory on the
bus itself (what the allocator holds); an app built with a fleet of its own hands the job that fleet. A
proposal past the limits (nodes, devices added) is refused before the nodes are built."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from pydantic import Field, ValidationError

from services.admin_api.access import Caller, admin
from services.admin_api.fields import Input
from services.admin_api.nodes import last_heard_of
from services.admin_api.offload import Answer, Limits, Reach, json_answer, ledger, validation_detail, workers
from services.admin_api.problems import PROBLEMS, Problem, problem_doc
from shared.admission.quota import QuotaConfig, QuotaFileError, parse_quotas
from shared.admission.whatif import Change, what_if
from shared.contract.events import node_inventories
from shared.dra import model as dra
from shared.dra.cel import SelectorError, compile_selector
from shared.dra.classes import merge_classes
from shared.dra.inventory import Fleet
from shared.fleet.freshness import stale_nodes
from shared.fleet.sources import InventoryFileError, documents_from
from shared.ledger.claims_read import claim_rows, claims_of
from shared.ledger.past_use import past_use_now
from shared.ledger.quota_store import load_quota_config

router = APIRouter(responses=PROBLEMS)


class WhatIfIn(Input):
    quotas: dict[str, Any] | None = Field(default=None, description="a whole proposed Quotas document")
    add_inventory: list[dict[str, Any]] = Field(default_factory=list, max_length=10_000, description=(
        "Topology documents or ResourceSlices (with DeviceClasses) of nodes to add"))
    drain: list[str] = Field(default_factory=list, max_length=10_000, description="nodes to take away")
    remove_tenants: list[str] = Field(default_factory=list, max_length=10_000)
    cohorts: list[dict[str, Any]] = Field(default_factory=list, max_length=10_000, description=(
        "cohorts to add or replace, as the Quotas file lists them ({name, parent, quotas}), on today's "
        "configuration or the proposed `quotas`: tree edits; a cycle or an unknown parent is a 422"))
    half_life: float | None = Field(default=None, ge=0, allow_inf_nan=False, description=(
        "seconds: a changed fairSharing.halfLife (0: past use off); none: as today or as the proposed quotas"))


_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": WhatIfIn.model_json_schema(
    by_alias=True)}}}}
_REFUSALS: dict[int | str, dict[str, Any]] = {
    413: problem_doc("the body is over CLAIMBROKER_ADMIN_MAX_BODY"),
    422: problem_doc("the proposal is invalid, or adds more nodes or devices than the limits allow; the detail "
                     "names the field, or the number and the limit"),
    503: problem_doc("no view of the fleet, or the work did not finish in time, ran out of memory or waited "
                     "behind others (Retry-After)")}


@router.post("/v1/whatif", tags=["whatif"], response_model=dict[str, Any], openapi_extra=_BODY, responses=_REFUSALS)
async def post_whatif(request: Request, token: Caller) -> Response:
    """Who would be admitted, preempted (with the rule, or drain) or beyond a cut quota, and each tenant's
    devices per flavor, share and waiting claims, now and after."""
    admin(token)
    pool = workers(request)
    fleet: Fleet | None = None
    if pool.reach.bus_url is None:
        fleet_of = getattr(request.app.state, "fleet", None)
        if fleet_of is None:
            raise Problem(503, "no view of the fleet", "this API process has no view of the fleet (run it with the "
                                                       "broker, or with NATS)")
        fleet = await fleet_of()  # the app's own (a test's, an embedding's): pickled to the job
    heard = last_heard_of(request, fleet) if fleet is not None else None  # else the bus's: its last messages
    return await pool.run(request, "what-if", what_if_job, await request.body(), fleet,
                          request.app.state.inventory_ttl, heard)


def proposed_size(documents: Iterable[Any]) -> tuple[int, int]:
    """Nodes and devices (GPUs) the documents would add, counted before anything is built: a Topology of
    a few bytes (`namePrefix` with `count`) may describe any number of nodes."""
    nodes: set[str] = set()
    generated = devices = 0
    for document in documents:
        if not isinstance(document, dict):
            continue
        if document.get("kind") == "Topology" and isinstance(document.get("nodes"), list):
            for spec in document["nodes"]:
                if not isinstance(spec, dict):
                    continue
                count = spec.get("count", 1) if "name" not in spec else 1
                gpus = spec.get("gpuCount", 0)
                count = count if isinstance(count, int) and count > 0 else 1
                generated += count
                devices += count * (gpus if isinstance(gpus, int) and gpus > 0 else 0)
        elif document.get("kind") == "ResourceSlice" and isinstance(document.get("spec"), dict):
            spec = document["spec"]
            if isinstance(spec.get("nodeName"), str):
                nodes.add(spec["nodeName"])
            devices += len(spec["devices"]) if isinstance(spec.get("devices"), list) else 0
    return generated + len(nodes), devices


def _fresh(fleet: Fleet) -> Fleet:
    """The fleet rebuilt from its fields: a device's and a node's cached kind ids come from the process
    that worked them out (shared/dra/inventory.intern_id) and mean nothing in this one."""
    return Fleet({name: replace(node, devices=tuple(replace(d) for d in node.devices))
                  for name, node in fleet.nodes.items()})


async def _bus_fleet(reach: Reach) -> Fleet:
    from services.bus.connection import BUS_ERRORS
    from services.bus.streams import read_fleet

    assert reach.bus_url is not None
    try:
        return await read_fleet(reach.bus_url, reach.tls_ca)
    except BUS_ERRORS as error:  # the bus is away or refuses: the request cannot be answered now
        raise Problem(503, "no view of the fleet", f"cannot read the fleet from the bus ({type(error).__name__}); "
                                                   "retry when NATS answers") from None


async def what_if_job(reach: Reach, limits: Limits, body: bytes, fleet: Fleet | None, ttl: float = float("inf"),
                      heard: Mapping[str, float] | None = None) -> Answer:
    """In a worker: the proposal checked (422 naming the field, or the size and its limit), the fleet and
    the ledger read, both states settled, with the nodes the allocator places nothing on (not heard of
    within `ttl`: `heard`, else each node's last message on the bus) left unused as it leaves them."""
    try:
        proposal = WhatIfIn.model_validate_json(body)
    except ValidationError as error:
        raise Problem(422, "invalid request", validation_detail(error.errors(), ("body",))) from None
    nodes_added, devices_added = proposed_size(proposal.add_inventory)
    for what, count, limit, setting in (("nodes", nodes_added, limits.whatif_max_nodes, "WHATIF_MAX_NODES"),
                                        ("devices", devices_added, limits.whatif_max_devices, "WHATIF_MAX_DEVICES")):
        if count > limit:
            raise Problem(422, "proposal too large", (
                f"addInventory: {count:,} {what} proposed, over the limit of {limit:,} (CLAIMBROKER_{setting}): "
                f"propose fewer {what}"))
    fleet = _fresh(fleet) if fleet is not None else await _bus_fleet(reach)
    unknown = sorted(set(proposal.drain) - set(fleet.nodes))
    if unknown:
        raise HTTPException(422, f"no node {', '.join(unknown)} in the fleet")
    try:
        proposed = parse_quotas(proposal.quotas, where="quotas") if proposal.quotas is not None else None
        for i, flavor in enumerate(proposed.listed_flavors if proposed is not None else ()):
            try:
                compile_selector(flavor.selector)
            except SelectorError as error:
                raise QuotaFileError(f"quotas.flavors[{i}].selector: {error}") from None
        added = documents_from(proposal.add_inventory, "addInventory") if proposal.add_inventory else None
    except (QuotaFileError, InventoryFileError, dra.DocumentError) as error:
        raise HTTPException(422, str(error)) from None
    nodes = node_inventories(added.slices, added.labels, observed_at=time.time()) if added is not None else ()
    async with ledger(reach) as factory, factory() as s:  # the rows only: parsed after the transaction
        rows = await claim_rows(s)
        config = await load_quota_config(s)
        # past use as the allocator keeps it, under today's half-life (or the proposed one, if today has none)
        counted = config.half_life or (proposal.half_life or 0.0) or (proposed.half_life if proposed else 0.0)
        past = await past_use_now(s, time.time(), counted) if counted > 0 else {}
    if proposal.cohorts or proposal.half_life is not None:
        try:
            proposed = tree_edited(proposed if proposed is not None else config, proposal.cohorts, proposal.half_life)
        except QuotaFileError as error:
            raise Problem(422, "invalid proposal", str(error)) from None
    running, waiting, documents = claims_of(rows)
    change = Change(quotas=proposed, add_nodes=nodes, drain=frozenset(proposal.drain),
                    remove_tenants=frozenset(proposal.remove_tenants))
    classes = merge_classes(added.classes if added is not None else [])
    last = heard if heard is not None else {name: node.observed_at for name, node in fleet.nodes.items()}
    unusable = stale_nodes(last, time.time(), ttl)
    return json_answer(what_if(fleet, classes, config, running, waiting, documents, change, unusable,
                               past).to_json())


def tree_edited(config: QuotaConfig, cohorts: list[dict[str, Any]], half_life: float | None) -> QuotaConfig:
    """`config` with these cohorts added or replaced (by name) and the half-life changed, read back through
    the Quotas file's parser: a cycle or an unknown parent is refused as an import refuses it."""
    document = config.to_document()
    listed = {c["name"]: c for c in document.get("cohorts", [])}
    for edit in cohorts:
        if not isinstance(edit.get("name"), str):
            raise QuotaFileError("cohorts: each edit needs a name")
        listed[edit["name"]] = edit
    document["cohorts"] = list(listed.values())
    if half_life is not None and not math.isfinite(half_life):
        raise QuotaFileError("halfLife: must be a finite number of seconds")
    chosen = half_life if half_life is not None else config.half_life
    document["fairSharing"] = {"halfLife": chosen}  # seconds as a number: the parser reads it exactly
    edited = parse_quotas(document, where="whatif")
    return replace(edited, default_min_runtime=config.default_min_runtime,
                   default_gang_reserve_after=config.default_gang_reserve_after)
