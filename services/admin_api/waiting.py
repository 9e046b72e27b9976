"""GET /v1/waiting: the queue as a person reads it, grouped by tenant and reason (a thousand claims waiting
for the same thing are one row), with how long they have waited, per tenant."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field
from sqlalchemy import select

from services.admin_api.common import PROBLEMS, Caller, Model, Session, Stamp
from shared.ledger.schema import Claim, Tenant

router = APIRouter(responses=PROBLEMS)


class WaitingGroup(Model):
    tenant: str
    reason: str
    claims: int
    devices: int = Field(description="devices the group's claims ask for, in all")
    oldest_submitted_at: Stamp
    oldest_wait_seconds: float


class TenantWaits(Model):
    tenant: str
    waiting: int
    p50_wait_seconds: float
    p90_wait_seconds: float
    max_wait_seconds: float
    past_alert_after: int = Field(description="claims waiting longer than the tenant's pendingAlertAfter")


class Waiting(Model):
    groups: list[WaitingGroup] = Field(description="largest first")
    tenants: list[TenantWaits]


def _asked(spec: Any) -> int:
    """Devices a claim document asks for (an All request counts one: its size is the fleet's)."""
    try:
        requests = spec["spec"]["devices"]["requests"]
    except (KeyError, TypeError):
        return 0
    total = 0
    for request in requests if isinstance(requests, list) else ():
        exactly = request.get("exactly") if isinstance(request, dict) else None
        if isinstance(exactly, dict):
            count = exactly.get("count", 1)
            total += count if isinstance(count, int) and exactly.get("allocationMode", "ExactCount") != "All" else 1
        elif isinstance(request, dict) and request.get("firstAvailable"):
            first = request["firstAvailable"][0] if isinstance(request["firstAvailable"], list) else {}
            total += first.get("count", 1) if isinstance(first, dict) and isinstance(first.get("count", 1), int) else 1
    return total


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))] if sorted_values else 0.0


@router.get("/v1/waiting", response_model=Waiting, tags=["claims"])
async def get_waiting(request: Request, s: Session, token: Caller) -> Waiting:
    """Waiting claims grouped by tenant and reason (count, devices asked, oldest), and per tenant the
    waits' p50, p90 and maximum and how many wait past its pendingAlertAfter. A tenant-scoped viewer sees
    its tenant only."""
    query = select(Claim.namespace, Claim.reason, Claim.spec, Claim.submitted_at).where(Claim.state == "Pending")
    if token.tenant is not None:
        query = query.where(Claim.namespace == token.tenant)
    now = datetime.now(UTC)
    default_after = float(getattr(request.app.state, "pending_alert_after", 600.0))
    after = {name: seconds for name, seconds in await s.execute(select(Tenant.name, Tenant.pending_alert_after_s))}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    waits: dict[str, list[float]] = {}
    for tenant, reason, spec, submitted in await s.execute(query):
        submitted = submitted if submitted.tzinfo is not None else submitted.replace(tzinfo=UTC)
        waited = max(0.0, (now - submitted).total_seconds())
        waits.setdefault(tenant, []).append(waited)
        group = groups.setdefault((tenant, reason or "not decided yet"),
                                  {"claims": 0, "devices": 0, "oldest": submitted})
        group["claims"] += 1
        group["devices"] += _asked(spec)
        group["oldest"] = min(group["oldest"], submitted)
    ordered = sorted(groups.items(), key=lambda item: (-item[1]["claims"], item[0]))
    out = Waiting(groups=[], tenants=[])
    for (tenant, reason), group in ordered:
        out.groups.append(WaitingGroup(tenant=tenant, reason=reason, claims=group["claims"], devices=group["devices"],
                                       oldest_submitted_at=group["oldest"],
                                       oldest_wait_seconds=round((now - group["oldest"]).total_seconds(), 1)))
    for tenant, values in sorted(waits.items()):
        values.sort()
        limit = after.get(tenant) or default_after
        out.tenants.append(TenantWaits(
            tenant=tenant, waiting=len(values), p50_wait_seconds=round(_percentile(values, 0.5), 1),
            p90_wait_seconds=round(_percentile(values, 0.9), 1), max_wait_seconds=round(values[-1], 1),
            past_alert_after=sum(1 for v in values if v > limit)))
    return out
