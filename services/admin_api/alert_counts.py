"""GET /v1/alerts/counts: the open alerts counted by kind, severity, tenant and flavor, for the usage page's
summary strip and its alerts folded by kind. Counted in the ledger: ten thousand open alerts (one per
claim waiting past its pendingAlertAfter) are a few rows here, where /v1/alerts gives a thousand at most."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import Field

from services.admin_api.access import Caller, Session
from services.admin_api.fields import Model, Stamp
from services.admin_api.problems import PROBLEMS
from shared.ledger.alerts import open_counts

router = APIRouter(responses=PROBLEMS)


class AlertCount(Model):
    kind: str
    severity: str
    tenant: str | None = Field(description="null: an alert of the fleet (a node, a device), which names no tenant")
    flavor: str | None = Field(description="the flavor the alerts name (their `flavor` label), if any")
    open: int = Field(description="open alerts of this kind, severity, tenant and flavor")
    last_seen: Stamp = Field(description="the newest of them")


@router.get("/v1/alerts/counts", response_model=list[AlertCount], tags=["alerts"])
async def count_open_alerts(s: Session, token: Caller) -> list[AlertCount]:
    """Open alerts per kind, severity, tenant and flavor. A scoped viewer counts its tenant's only, as
    /v1/alerts lists them."""
    rows = [AlertCount(kind=c.kind, severity=c.severity, tenant=c.tenant, flavor=c.flavor, open=c.open,
                       last_seen=c.last_seen) for c in await open_counts(s, token.tenant)]
    rows.sort(key=lambda r: (r.kind, r.severity, r.tenant or "", r.flavor or ""))
    return rows
