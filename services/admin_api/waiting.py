"""GET /v1/waiting: the queue as a person reads it, grouped by tenant and reason (a thousand claims waiting
for the same thing are one row), with how long they have waited, per tenant; and how long the claims
admitted within a window had waited, per tenant and flavor. A group says what kind of wait it is and
which flavors its claims would take, so the usage page can filter the queue by them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from services.admin_api.access import Caller, Principal, Session
from services.admin_api.fields import Model, Stamp
from services.admin_api.problems import PROBLEMS
from shared.ledger import pending
from shared.ledger.handles import AsyncSession
from shared.ledger.tenants import pending_alert_after
from shared.ledger.usage_history import WINDOWS

router = APIRouter(responses=PROBLEMS)


# What a group waits for, read from the allocator's explanation of its claims' latest Pending decision.
WaitKind = Literal["quota", "devices", "unsatisfiable", "budget", "undecided", "unexplained"]


class WaitingGroup(Model):
    tenant: str
    reason: str
    claims: int
    devices: int = Field(description="devices the group's claims ask for, in all")
    oldest_submitted_at: Stamp
    oldest_wait_seconds: float
    kind: WaitKind = Field(default="unexplained", description=(
        "quota: a quota blocks it; devices: not enough matching devices are free; unsatisfiable: no device of "
        "the fleet matches; budget: its placement search ran out of the cycle's budget and goes on; undecided: "
        "the allocator has not decided yet; unexplained: decided before explanations were kept"))
    flavors: list[str] = Field(default_factory=list, description=(
        "the flavors the group's claims' requests accept (the allocator's explain), empty until explained"))


class TenantWaits(Model):
    tenant: str
    waiting: int
    p50_wait_seconds: float
    p90_wait_seconds: float
    max_wait_seconds: float
    past_alert_after: int = Field(description="claims waiting longer than the tenant's pendingAlertAfter")


class AdmittedWaits(Model):
    tenant: str
    flavor: str | None = Field(description="of the claim's allocation (its first device)")
    admitted: int = Field(description="claims allocated within the window")
    p50_wait_seconds: float
    p90_wait_seconds: float
    max_wait_seconds: float


class Waiting(Model):
    groups: list[WaitingGroup] = Field(description="largest first")
    tenants: list[TenantWaits]
    window: str
    admitted: list[AdmittedWaits] = Field(description="per tenant and flavor, how long the claims allocated "
                                                      "within the window waited from submission")


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


async def _admitted(s: AsyncSession, token: Principal, window: str, now: datetime) -> list[AdmittedWaits]:
    since = now - timedelta(seconds=WINDOWS[window][0])
    waits: dict[tuple[str, str | None], list[float]] = {}
    for tenant, flavor, submitted, allocated in await pending.admitted_since(s, since, token.tenant):
        waited = (_aware(allocated) - _aware(submitted)).total_seconds()
        waits.setdefault((tenant, flavor), []).append(max(0.0, waited))
    out = []
    for (tenant, flavor), values in sorted(waits.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        values.sort()
        out.append(AdmittedWaits(tenant=tenant, flavor=flavor, admitted=len(values),
                                 p50_wait_seconds=round(_percentile(values, 0.5), 1),
                                 p90_wait_seconds=round(_percentile(values, 0.9), 1),
                                 max_wait_seconds=round(values[-1], 1)))
    return out


def _kind(reason: str | None, quota: Any, unsatisfiable: Any, budget: Any) -> WaitKind:
    """What kind of wait a claim's latest Pending decision was, from its explanation's parts (every
    explanation says whether the claim is unsatisfiable: without that, there was none)."""
    if reason is None:
        return "undecided"
    if unsatisfiable is None:
        return "unexplained"
    if unsatisfiable:
        return "unsatisfiable"
    if budget:
        return "budget"
    return "quota" if quota else "devices"


async def _kinds(s: AsyncSession, first: dict[tuple[str, str], tuple[int, str | None]]
                 ) -> dict[tuple[str, str], WaitKind]:
    """Each group's kind, from one of its claims: the claims of a group share their reason, so they share
    the decision that gave it (reading every claim's explanation would cost the 10,000-claim queue a third
    more time)."""
    parts = await pending.explain_parts(s, [claim_id for claim_id, _ in first.values()])
    return {group: _kind(reason, *parts.get(claim_id, (None, None, None)))
            for group, (claim_id, reason) in first.items()}


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))] if sorted_values else 0.0


@router.get("/v1/waiting", response_model=Waiting, tags=["claims"])
async def get_waiting(request: Request, s: Session, token: Caller,
                      window: Literal["hour", "day", "week"] = "hour") -> Waiting:
    """Waiting claims grouped by tenant and reason (count, devices asked, oldest, the kind of wait, the
    flavors they would take), per tenant the waits' p50, p90 and maximum and how many wait past its
    pendingAlertAfter, and per tenant and flavor how long the claims allocated within the window had
    waited. A tenant-scoped viewer sees its tenant only."""
    now = datetime.now(UTC)
    default_after = float(getattr(request.app.state, "pending_alert_after", 600.0))
    after = await pending_alert_after(s)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    first: dict[tuple[str, str], tuple[int, str | None]] = {}  # a claim of each group: what its kind is read from
    waits: dict[str, list[float]] = {}
    for claim_id, tenant, reason, spec, submitted, flavors in await pending.pending_claims(s, token.tenant):
        submitted = _aware(submitted)
        waited = max(0.0, (now - submitted).total_seconds())
        waits.setdefault(tenant, []).append(waited)
        key = (tenant, reason or "not decided yet")
        group = groups.get(key)
        if group is None:
            group = groups[key] = {"claims": 0, "devices": 0, "oldest": submitted, "flavors": set()}
            first[key] = (claim_id, reason)
        group["claims"] += 1
        group["devices"] += _asked(spec)
        group["oldest"] = min(group["oldest"], submitted)
        if isinstance(flavors, list):
            group["flavors"].update(f for f in flavors if isinstance(f, str))
    ordered = sorted(groups.items(), key=lambda item: (-item[1]["claims"], item[0]))
    kinds = await _kinds(s, first)
    out = Waiting(groups=[], tenants=[], window=window, admitted=await _admitted(s, token, window, now))
    for (tenant, reason), group in ordered:
        out.groups.append(WaitingGroup(tenant=tenant, reason=reason, claims=group["claims"], devices=group["devices"],
                                       oldest_submitted_at=group["oldest"],
                                       oldest_wait_seconds=round((now - group["oldest"]).total_seconds(), 1),
                                       kind=kinds[(tenant, reason)], flavors=sorted(group["flavors"])))
    for tenant, values in sorted(waits.items()):
        values.sort()
        limit = after.get(tenant) or default_after
        out.tenants.append(TenantWaits(
            tenant=tenant, waiting=len(values), p50_wait_seconds=round(_percentile(values, 0.5), 1),
            p90_wait_seconds=round(_percentile(values, 0.9), 1), max_wait_seconds=round(values[-1], 1),
            past_alert_after=sum(1 for v in values if v > limit)))
    return out
