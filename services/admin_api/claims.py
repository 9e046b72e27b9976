"""Reads of what the services wrote: claims (with history and explain), alerts, dead letters and the audit log.

A claim's namespace is its tenant, so a scoped viewer's filter is on namespace.
"""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import Field
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.admin_api.common import PROBLEMS, Caller, Model, Name, Principal, Session, Stamp, admin, visible
from shared.ledger.schema import AlertRecord, AuditEntry, Claim, ClaimEvent, DeadLetter

router = APIRouter(responses=PROBLEMS)
Limit = Annotated[int, Query(ge=1, le=1000)]
Cursor = Annotated[int | None, Query(ge=0, le=2**63 - 1,  # claim ids are 64-bit in the ledger
                                     description="`next` of the previous page")]


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
    query = select(Claim).order_by(Claim.id).limit(limit + 1)
    if token.tenant is not None:
        query = query.where(Claim.namespace == token.tenant)
    if namespace:
        query = query.where(Claim.namespace == namespace)
    if state:
        query = query.where(Claim.state == state)
    if node:
        query = query.where(Claim.node == node)
    if cursor is not None:
        query = query.where(Claim.id > cursor)
    rows = list(await s.scalars(query))
    more = len(rows) > limit
    rows = rows[:limit]
    return ClaimPage(items=[ClaimOut.model_validate(c) for c in rows], next=rows[-1].id if more else None)


async def _claim(s: AsyncSession, token: Principal, namespace: str, name: str) -> Claim:
    visible(token, namespace)
    row = await s.scalar(select(Claim).where(Claim.namespace == namespace, Claim.name == name))
    if row is None:
        raise HTTPException(404, f"claim {namespace}/{name} not found")
    return row


@router.get("/v1/claims/{namespace}/{name}", response_model=ClaimDetail, tags=["claims"])
async def get_claim(namespace: Name, name: Name, s: Session, token: Caller) -> ClaimDetail:
    row = await _claim(s, token, namespace, name)
    events = await s.scalars(select(ClaimEvent).where(ClaimEvent.claim_id == row.id)
                             .order_by(ClaimEvent.sequence, ClaimEvent.id))
    return ClaimDetail.model_validate({**ClaimOut.model_validate(row).model_dump(),
                                       "history": [EventOut.model_validate(e) for e in events]})


@router.get("/v1/claims/{namespace}/{name}/explain", response_model=ExplainOut, tags=["claims"])
async def explain_claim(namespace: Name, name: Name, s: Session, token: Caller) -> ExplainOut:
    """Why it waits, as the allocator wrote it with its latest Pending decision."""
    row = await _claim(s, token, namespace, name)
    return ExplainOut(namespace=row.namespace, name=row.name, state=row.state, reason=row.reason,
                      explain=row.explain)


@router.get("/v1/alerts", response_model=list[AlertOut], tags=["alerts"])
async def list_alerts(s: Session, token: Caller, kind: str | None = None, resolved: bool | None = None,
                      limit: Limit = 100) -> list[AlertOut]:
    """Newest first. A scoped viewer sees its tenant's alerts only, not fleet-wide ones (nodes,
    devices), which name no tenant."""
    query = select(AlertRecord).order_by(AlertRecord.last_seen.desc(), AlertRecord.id.desc()).limit(limit)
    if token.tenant is not None:
        query = query.where(AlertRecord.tenant == token.tenant)
    if kind:
        query = query.where(AlertRecord.kind == kind)
    if resolved is not None:
        query = query.where(AlertRecord.resolved == resolved)
    return [AlertOut.model_validate(a) for a in await s.scalars(query)]


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
    head = func.substr(DeadLetter.payload, 1, 8000).label("head")  # a payload may be a megabyte: read its head
    rows = await s.execute(select(DeadLetter.id, DeadLetter.consumer, DeadLetter.message_id, DeadLetter.subject,
                                  DeadLetter.payload_size, head, DeadLetter.error, DeadLetter.deliveries,
                                  DeadLetter.created_at).order_by(DeadLetter.id.desc()).limit(limit))
    return [DeadLetterOut(id=r.id, consumer=r.consumer, message_id=r.message_id, subject=r.subject,
                          payload_size=r.payload_size, payload_preview=bytes(r.head).decode("utf-8", "replace")[:2000],
                          error=r.error, deliveries=r.deliveries, created_at=r.created_at) for r in rows]


@router.get("/v1/audit", response_model=list[AuditOut], tags=["audit"])
async def list_audit(s: Session, token: Caller, limit: Limit = 100,
                     entity: Annotated[str | None, Query(description="prefix, e.g. quota/vision/")] = None,
                     ) -> list[AuditOut]:
    """Newest first; admins only, since it shows every tenant's settings."""
    admin(token)
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if entity:
        escaped = entity.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(AuditEntry.entity.like(f"{escaped}%", escape="\\"))
    return [AuditOut.model_validate(e) for e in await s.scalars(query)]
