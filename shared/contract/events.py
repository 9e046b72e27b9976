"""Payloads on the wire (the contract's JSON), built from domain values. No I/O here."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, cast

from shared.contract.messages import Allocation, ClaimState, ClaimStatus
from shared.dra import model as dra
from shared.dra.inventory import FleetDevice, NodeInventory, counters_from_slices, devices_from_slices
from shared.fleet import telemetry


def now_iso(timestamp: float | None = None) -> str:
    moment = datetime.fromtimestamp(timestamp, UTC) if timestamp is not None else datetime.now(UTC)
    return moment.isoformat().replace("+00:00", "Z")


def claim_status(
    *,
    namespace: str,
    name: str,
    state: str,
    allocation: Mapping[str, Any] | None,
    reason: str | None,
    sequence: int,
    observed_at: float | None = None,
    by: str | None = None,
    unsatisfiable: bool = False,
) -> ClaimStatus:
    """The contract's status object; `by` names the preemptor of a Preempted claim and `unsatisfiable`
    marks a Pending claim no device of today's fleet could ever satisfy (both only when they apply).
    `state` is a `shared.dra.results.State` value and `allocation` an `Allocation.to_json()`, as the
    allocator's ledger rows hold them: taken as they are, not validated (one status per decision)."""
    status: ClaimStatus = {
        "namespace": namespace,
        "name": name,
        "state": cast(ClaimState, state),
        "allocation": cast(Allocation, dict(allocation)) if allocation else None,
        "reason": reason,
        "observedAt": now_iso(observed_at),
        "sequence": sequence,
    }
    if by is not None:
        status["by"] = by
    if unsatisfiable:
        status["unsatisfiable"] = True
    return status


def node_inventories(slices: Sequence[dra.ResourceSlice], labels: Mapping[str, Mapping[str, str]], *,
                     observed_at: float, sequence: int = 1) -> tuple[NodeInventory, ...]:
    """Each node's inventory from node-local slices, as a watcher would publish it and a reader read it
    (what-if's added nodes, the MIG planner's re-laid ones)."""
    by_node: dict[str, list[dra.ResourceSlice]] = {}
    for piece in slices:
        if piece.spec.node_name:
            by_node.setdefault(piece.spec.node_name, []).append(piece)
    return tuple(read_inventory(inventory_payload(node, pieces, labels=labels.get(node, {}), sequence=sequence,
                                                  observed_at=observed_at))
                 for node, pieces in sorted(by_node.items()))


def inventory_payload(
    node: str,
    slices: Sequence[dra.ResourceSlice],
    *,
    labels: Mapping[str, str],
    sequence: int,
    observed_at: float,
    telemetry: Mapping[str, Any] | None = None,
    removed: bool = False,
) -> dict[str, Any]:
    return {
        "node": node,
        "sequence": sequence,
        "observedAt": now_iso(observed_at),
        "observedAtUnix": observed_at,
        "removed": removed,
        "labels": dict(labels),
        "telemetry": dict(telemetry or {}),
        "slices": [s.model_dump(mode="json", by_alias=True, exclude_none=True) for s in slices],
    }


def content_id(payload: Mapping[str, Any], *ignore: str) -> str:
    """A stable digest of a payload without its volatile fields: equal content, equal Nats-Msg-Id."""
    body = {k: v for k, v in payload.items() if k not in ignore}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]


def read_inventory(payload: Mapping[str, Any]) -> NodeInventory:
    """Parse an inventory message; raises dra.DocumentError naming the field."""
    node = payload.get("node")
    if not isinstance(node, str) or not node:
        raise dra.DocumentError("node: required")
    if payload.get("removed"):
        return NodeInventory(node=node, devices=(), removed=True, sequence=int(payload.get("sequence", 0)))
    slices = []
    for index, document in enumerate(payload.get("slices") or []):
        obj = dra.parse_object(document)
        if not isinstance(obj, dra.ResourceSlice):
            raise dra.DocumentError(f"slices[{index}]: expected ResourceSlice")
        slices.append(obj)
    readings = telemetry.from_json(payload.get("telemetry"))
    devices = devices_from_slices(slices).get(node, [])
    if readings:  # telemetry marks devices throttled or unhealthy; placement reads it from the device
        devices = [_with_reading(d, readings.get(d.name)) for d in devices]
    return NodeInventory(
        node=node,
        devices=tuple(devices),
        labels=dict(payload.get("labels") or {}),
        counters=counters_from_slices(slices).get(node, {}),
        sequence=int(payload.get("sequence", 0)),
        observed_at=float(payload.get("observedAtUnix", 0.0)),
    )


def _with_reading(device: FleetDevice, reading: telemetry.DeviceTelemetry | None) -> FleetDevice:
    if reading is None:
        return device
    return replace(device, health=reading.health, temperature_c=reading.temperature_c,
                   throttle_reasons=reading.throttle_reasons)


def alert(
    *,
    kind: str,
    severity: str,
    key: str,
    summary: str,
    details: Mapping[str, Any],
    labels: Mapping[str, str],
    first_seen: float,
    last_seen: float,
    count: int = 1,
    resolved: bool = False,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "severity": severity,
        "key": key,
        "tenant": labels.get("tenant"),  # also the subject's last token (`_fleet` when None)
        "summary": summary,
        "details": dict(details),
        "labels": dict(labels),
        "firstSeen": now_iso(first_seen),
        "lastSeen": now_iso(last_seen),
        "count": count,
        "resolved": resolved,
    }
