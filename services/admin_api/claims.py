"""Reads of what the services wrote: claims (with history and explain), alerts, dead letters and the audit log.

A claim's namespace is its tenant, so a scoped viewer's filter is on namespace.
"""

import time
from typing import Annotated, Any, Self

from fastapi import APIRouter, HTTPException, Query
from pydantic import AliasChoices, Field, model_validator

from services.admin_api.access import Caller, Principal, Session, admin, visible
from services.admin_api.fields import Model, Name, Stamp
from services.admin_api.problems import PROBLEMS
from shared.admission.estimate_publishing import error_summary
from shared.ledger import alerts, audit, dead_letters, estimates
from shared.ledger.claim_listing import ClaimFilter, claim_events, claim_named, claim_page
from shared.ledger.handles import AsyncSession
from shared.ledger.schema import Claim

router = APIRouter(responses=PROBLEMS)
Limit = Annotated[int, Query(ge=1, le=1000)]
Cursor = Annotated[int | None, Query(ge=0, le=2**63 - 1,  # claim ids are 64-bit in the ledger
                                     description="`next` of the previous page")]


# the ledger's column, the field's own name (a ClaimOut dumped again), the body's name
_REASON = AliasChoices("estimate_reason", "estimated_start_reason", "estimatedStartReason")


class ClaimOut(Model):
    namespace: str
    name: str
    state: str
    reason: str | None
    allocation: dict[str, Any] | None
    node: str | None
    priority: int
    preemptible: bool
    submitted_at: Stamp
    updated_at: Stamp
    estimated_start: dict[str, Any] | None = Field(
        default=None, description="Pending only: the start estimate last published on its status subject "
                                  "({p50, p90, blockedBy}); null if none was, or a null one was")
    estimated_start_reason: str | None = Field(
        default=None, validation_alias=_REASON, serialization_alias="estimatedStartReason",
        description="Pending only: why the start estimate last published is null (its status's "
                    "estimatedStartReason); null if it had a value, or none was published")

    @model_validator(mode="after")
    def _pending_only(self) -> Self:
        if self.state != "Pending":  # a claim withdrawn while it waited keeps its last estimate in the ledger
            self.estimated_start = self.estimated_start_reason = None
        return self


class ClaimPage(Model):
    items: list[ClaimOut]
    next: int | None = Field(description="pass as `cursor` for the next page; null on the last page")


class EventOut(Model):
    sequence: int
    at: Stamp
    state: str
    reason: str | None
    node: str | None
    by: str | None = Field(description="the preemptor, tenant/claim, when it was preempted")


class ClaimDetail(ClaimOut):
    history: list[EventOut] = Field(description="every status it was given, oldest first")


class ExplainOut(Model):
    namespace: str
    name: str
    state: str
    reason: str | None
    explain: dict[str, Any] | None = Field(description="the allocator's structured reason; null if none")
    estimated_start: dict[str, Any] | None = Field(
        default=None, description="Pending only: the start estimate last published ({p50, p90, blockedBy}); "
                                  "null if none was, or a null one was")
    estimated_start_reason: str | None = Field(
        default=None, validation_alias=_REASON, serialization_alias="estimatedStartReason",
        description="Pending only: why the start estimate last published is null; null if it had a value, or "
                    "none was published")


class AlertOut(Model):
    """One alert episode from the notifier's history, as its latest message said it."""

    key: str
    kind: str
    severity: str
    tenant: str | None
    summary: str
    details: dict[str, Any]
    labels: dict[str, Any]
    first_seen: Stamp
    last_seen: Stamp
    count: int
    resolved: bool
    resolved_at: Stamp | None


class AuditOut(Model):
    id: int
    at: Stamp
    actor: str = Field(description="token:<id> of the token that wrote")
    action: str
    entity: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@router.get("/v1/claims", response_model=ClaimPage, tags=["claims"])
async def list_claims(s: Session, token: Caller, namespace: str | None = None, state: str | None = None,
                      node: str | None = None, limit: Limit = 100,
                      cursor: Cursor = None,
                      ) -> ClaimPage:
    """Oldest first (by id), one page at a time."""
    rows, following = await claim_page(s, ClaimFilter(token.tenant, namespace, state, node), limit, cursor)
    return ClaimPage(items=[ClaimOut.model_validate(c) for c in rows], next=following)


async def _claim(s: AsyncSession, token: Principal, namespace: str, name: str) -> Claim:
    visible(token, namespace)
    row = await claim_named(s, namespace, name)
    if row is None:
        raise HTTPException(404, f"claim {namespace}/{name} not found")
    return row


@router.get("/v1/claims/{namespace}/{name}", response_model=ClaimDetail, tags=["claims"])
async def get_claim(namespace: Name, name: Name, s: Session, token: Caller) -> ClaimDetail:
    row = await _claim(s, token, namespace, name)
    events = await claim_events(s, row.id)
    return ClaimDetail.model_validate({**ClaimOut.model_validate(row).model_dump(),
                                       "history": [EventOut.model_validate(e) for e in events]})


@router.get("/v1/claims/{namespace}/{name}/explain", response_model=ExplainOut, tags=["claims"])
async def explain_claim(namespace: Name, name: Name, s: Session, token: Caller) -> ExplainOut:
    """Why it waits, as the allocator wrote it with its latest Pending decision."""
    row = await _claim(s, token, namespace, name)
    return ExplainOut(namespace=row.namespace, name=row.name, state=row.state, reason=row.reason,
                      explain=row.explain, estimated_start=_estimate(row),
                      estimated_start_reason=row.estimate_reason if row.state == "Pending" else None)


def _estimate(row: Claim) -> dict[str, Any] | None:
    return row.estimated_start if row.state == "Pending" else None


class EstimateErrorOut(Model):
    """Start estimates against actual starts, in seconds: the median and p90 of |actual start - p50|."""

    tenant: str | None = Field(description="null: every tenant")
    flavor: str | None = Field(description="the flavor it was allocated on; null: every flavor, or none")
    claims: int = Field(description="claims allocated in the window with an estimate published")
    first_p50: float | None = Field(description="of the first estimate published for each claim")
    first_p90: float | None
    last_p50: float = Field(description="of the last estimate published before its start")
    last_p90: float


class EstimatesOut(Model):
    window: float = Field(description="seconds: the claims allocated within it, up to now")
    overall: EstimateErrorOut | None = Field(description="every tenant and flavor; null when none was measured")
    groups: list[EstimateErrorOut] = Field(description="per tenant and flavor")


@router.get("/v1/estimates", response_model=EstimatesOut, tags=["claims"])
async def estimate_error(s: Session, token: Caller,
                         window: Annotated[float, Query(gt=0, le=30 * 86400, description="seconds")] = 7 * 86400,
                         ) -> EstimatesOut:
    """How good the start estimates were (issue 39): over the claims allocated within `window`, per tenant and
    flavor, the error of the first and the last estimate published for each. A tenant's token sees its own."""
    errors = await estimates.estimate_errors(s, time.time() - window, tenant=token.tenant)
    overall, groups = error_summary((e.tenant, e.flavor, e.first, e.last) for e in errors)
    return EstimatesOut(window=window, overall=EstimateErrorOut.model_validate(overall) if overall else None,
                        groups=[EstimateErrorOut.model_validate(g) for g in groups])


@router.get("/v1/alerts", response_model=list[AlertOut], tags=["alerts"])
async def list_alerts(s: Session, token: Caller, kind: str | None = None, resolved: bool | None = None,
                      limit: Limit = 100) -> list[AlertOut]:
    """Newest first. A scoped viewer sees its tenant's alerts only, not fleet-wide ones (nodes,
    devices), which name no tenant."""
    rows = await alerts.latest_alerts(s, limit, tenant=token.tenant, kind=kind, resolved=resolved)
    return [AlertOut.model_validate(a) for a in rows]


class DeadLetterOut(Model):
    """A message the allocator could not commit even on its own, kept with its error."""

    id: int
    consumer: str
    message_id: str
    subject: str
    payload_size: int = Field(description="bytes received")
    payload_preview: str = Field(description="the first 2,000 characters, undecodable bytes replaced")
    error: str
    deliveries: int
    created_at: Stamp


@router.get("/v1/dead-letters", response_model=list[DeadLetterOut], tags=["dead letters"])
async def list_dead_letters(s: Session, token: Caller, limit: Limit = 100) -> list[DeadLetterOut]:
    """Newest first; admins only, since a message may be any tenant's."""
    admin(token)
    return [DeadLetterOut(id=r.id, consumer=r.consumer, message_id=r.message_id, subject=r.subject,
                          payload_size=r.payload_size, payload_preview=r.payload_head.decode("utf-8", "replace")[:2000],
                          error=r.error, deliveries=r.deliveries, created_at=r.created_at)
            for r in await dead_letters.latest_dead_letters(s, limit)]


@router.get("/v1/audit", response_model=list[AuditOut], tags=["audit"])
async def list_audit(s: Session, token: Caller, limit: Limit = 100,
                     entity: Annotated[str | None, Query(description="prefix, e.g. quota/vision/")] = None,
                     ) -> list[AuditOut]:
    """Newest first; admins only, since it shows every tenant's settings."""
    admin(token)
    return [AuditOut.model_validate(e) for e in await audit.latest_entries(s, limit, entity)]
