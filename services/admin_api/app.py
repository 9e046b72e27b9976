"""The admin API: tenants, quotas and claims over the SQL ledger, with bearer tokens.

Admin tokens write, viewer tokens read (a tenant-scoped viewer sees only its tenant). Every error is
application/problem+json. Every write is audited in the same transaction as the change itself.
(No `from __future__ import annotations` here: FastAPI must see the dependency aliases, which are
local to create_app, as real objects.)
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.ledger.engine import sessions
from shared.ledger.schema import AlertRecord, AuditEntry, Claim, Cohort, Quota, Tenant
from shared.ledger.tokens import lookup_token

PROBLEM = "application/problem+json"
Name = Annotated[str, Path(min_length=1, max_length=253)]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, from_attributes=True)


class _Input(_Model):
    """Unknown fields are refused, so a misspelt limit is a 422 rather than a silently ignored one."""

    model_config = ConfigDict(extra="forbid")


class TenantIn(_Input):
    cohort: str | None = Field(default=None, min_length=1, max_length=253)
    weight: float = Field(default=1.0, gt=0)
    pending_alert_after: float | None = Field(default=None, gt=0, description="seconds")


class TenantOut(_Model):
    name: str
    cohort: str | None
    weight: float
    pending_alert_after: float | None = Field(description="seconds")


class QuotaIn(_Input):
    nominal: int = Field(default=0, ge=0)
    borrowing_limit: int | None = Field(default=None, ge=0)
    lending_limit: int | None = Field(default=None, ge=0)


class QuotaOut(_Model):
    tenant: str
    flavor: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None


class ClaimOut(_Model):
    namespace: str
    name: str
    state: str
    reason: str | None
    allocation: dict[str, Any] | None
    priority: int
    preemptible: bool
    submitted_at: datetime
    updated_at: datetime

    @field_validator("submitted_at", "updated_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        """SQLite hands back naive UTC timestamps, PostgreSQL aware ones; clients get the same from both."""
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value


class AlertOut(_Model):
    """One alert episode from the notifier's history, as its latest message said it."""

    key: str
    kind: str
    severity: str
    tenant: str | None
    summary: str
    details: dict[str, Any]
    labels: dict[str, Any]
    first_seen: datetime
    last_seen: datetime
    count: int
    resolved: bool
    resolved_at: datetime | None

    @field_validator("first_seen", "last_seen", "resolved_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


@dataclass(frozen=True)
class Principal:
    """Who is calling, read once per request from the token table."""

    id: int
    role: str
    tenant: str | None


def _problem(status: int, title: str, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status, media_type=PROBLEM, headers=headers,
    )


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


def _tenant_out(row: Tenant) -> TenantOut:
    return TenantOut(name=row.name, cohort=row.cohort, weight=row.weight,
                     pending_alert_after=row.pending_alert_after_s)


def _dump(model: BaseModel | None) -> dict[str, Any] | None:
    """Audit rows hold what a client would have seen, camelCase, so before/after read like the API."""
    return model.model_dump(mode="json", by_alias=True) if model is not None else None


def create_app(engine: AsyncEngine) -> FastAPI:
    """Everything the app needs comes in through `engine`; nothing is read from the environment here."""
    factory = sessions(engine)
    app = FastAPI(title="claim-broker admin API", version="1")
    bearer = HTTPBearer(auto_error=False, description="an API token from `claimbroker token create`")

    async def _http_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        status = error.status_code
        detail = error.detail if status < 500 else _phrase(status)
        title = detail if isinstance(detail, str) and status < 500 else _phrase(status)
        return _problem(status, title, detail, getattr(error, "headers", None))

    async def _invalid(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        return _problem(422, "invalid request", detail)

    async def _crash(_: Request, __: Exception) -> JSONResponse:
        """Internals stay in the server log; the client learns only that it was not its fault."""
        return _problem(500, "Internal Server Error", "the server failed; see its log")

    # FastAPI's HTTPException subclasses Starlette's, but both are named so neither path can slip past.
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(Exception, _crash)

    async def session() -> AsyncIterator[AsyncSession]:
        async with factory() as s:
            yield s

    Session = Annotated[AsyncSession, Depends(session)]
    Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]

    async def caller(s: Session, credentials: Credentials) -> Principal:
        found = await lookup_token(s, credentials.credentials) if credentials is not None else None
        principal = Principal(found.id, found.role, found.tenant) if found is not None else None
        await s.rollback()  # routes open their own transaction
        if principal is None:
            raise HTTPException(401, "a valid bearer token is required",
                                headers={"WWW-Authenticate": "Bearer"})
        return principal

    Caller = Annotated[Principal, Depends(caller)]

    def admin(token: Principal) -> None:
        if token.role != "admin":
            raise HTTPException(403, "this token may only read")

    def visible(token: Principal, tenant: str) -> None:
        """A scoped viewer gets 404, not 403, for other tenants: it must not learn which ones exist."""
        if token.tenant is not None and token.tenant != tenant:
            raise HTTPException(404, f"tenant {tenant!r} not found")

    def audit(s: AsyncSession, token: Principal, action: str, entity: str,
              before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        s.add(AuditEntry(actor=f"token:{token.id}", action=action, entity=entity, before=before, after=after))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness only: the process answers. The ledger is /readyz's business."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "the ledger does not answer"}})
    async def readyz(s: Session) -> JSONResponse:
        try:
            await s.execute(text("SELECT 1"))
        except Exception as error:  # any failure means not ready
            return _problem(503, "ledger unavailable", type(error).__name__)
        return JSONResponse({"status": "ready"})

    @app.get("/v1/tenants", response_model=list[TenantOut], response_model_by_alias=True)
    async def list_tenants(s: Session, token: Caller) -> list[TenantOut]:
        query = select(Tenant).order_by(Tenant.name)
        if token.tenant is not None:
            query = query.where(Tenant.name == token.tenant)
        return [_tenant_out(t) for t in await s.scalars(query)]

    @app.get("/v1/tenants/{name}", response_model=TenantOut, response_model_by_alias=True)
    async def get_tenant(name: Name, s: Session, token: Caller) -> TenantOut:
        visible(token, name)
        row = await s.get(Tenant, name)
        if row is None:
            raise HTTPException(404, f"tenant {name!r} not found")
        return _tenant_out(row)

    @app.put("/v1/tenants/{name}", response_model=TenantOut, response_model_by_alias=True)
    async def put_tenant(name: Name, body: TenantIn, s: Session, token: Caller) -> TenantOut:
        """Create or replace. A cohort named for the first time is created here, in the same write (and
        audit row) as the tenant, so no separate step is needed."""
        admin(token)
        async with s.begin():
            if body.cohort is not None and await s.get(Cohort, body.cohort) is None:
                s.add(Cohort(name=body.cohort))
                await s.flush()
            row = await s.get(Tenant, name)
            before = _dump(_tenant_out(row)) if row is not None else None
            if row is None:
                row = Tenant(name=name)
                s.add(row)
            row.cohort, row.weight = body.cohort, body.weight
            row.pending_alert_after_s = body.pending_alert_after
            after = _tenant_out(row)
            audit(s, token, "put", f"tenant/{name}", before, _dump(after))
        return after

    @app.delete("/v1/tenants/{name}", status_code=204)
    async def delete_tenant(name: Name, s: Session, token: Caller) -> None:
        """The tenant's quotas go with it, each audited, rather than vanishing by cascade unrecorded."""
        admin(token)
        async with s.begin():
            row = await s.get(Tenant, name)
            if row is None:
                raise HTTPException(404, f"tenant {name!r} not found")
            for quota in await s.scalars(select(Quota).where(Quota.tenant == name).order_by(Quota.flavor)):
                before = _dump(QuotaOut.model_validate(quota))
                audit(s, token, "delete", f"quota/{name}/{quota.flavor}", before, None)
                await s.delete(quota)
            audit(s, token, "delete", f"tenant/{name}", _dump(_tenant_out(row)), None)
            await s.delete(row)

    @app.get("/v1/tenants/{name}/quotas", response_model=list[QuotaOut], response_model_by_alias=True)
    async def list_quotas(name: Name, s: Session, token: Caller) -> list[QuotaOut]:
        visible(token, name)
        if await s.get(Tenant, name) is None:
            raise HTTPException(404, f"tenant {name!r} not found")
        rows = await s.scalars(select(Quota).where(Quota.tenant == name).order_by(Quota.flavor))
        return [QuotaOut.model_validate(q) for q in rows]

    @app.put("/v1/tenants/{name}/quotas/{flavor}", response_model=QuotaOut, response_model_by_alias=True)
    async def put_quota(name: Name, flavor: Name, body: QuotaIn, s: Session, token: Caller) -> QuotaOut:
        admin(token)
        async with s.begin():
            if await s.get(Tenant, name) is None:
                raise HTTPException(404, f"tenant {name!r} not found")
            row = await s.get(Quota, (name, flavor))
            before = _dump(QuotaOut.model_validate(row)) if row is not None else None
            if row is None:
                row = Quota(tenant=name, flavor=flavor)
                s.add(row)
            row.nominal, row.borrowing_limit = body.nominal, body.borrowing_limit
            row.lending_limit = body.lending_limit
            after = QuotaOut.model_validate(row)
            audit(s, token, "put", f"quota/{name}/{flavor}", before, _dump(after))
        return after

    @app.delete("/v1/tenants/{name}/quotas/{flavor}", status_code=204)
    async def delete_quota(name: Name, flavor: Name, s: Session, token: Caller) -> None:
        admin(token)
        async with s.begin():
            row = await s.get(Quota, (name, flavor))
            if row is None:
                raise HTTPException(404, f"quota {name}/{flavor} not found")
            audit(s, token, "delete", f"quota/{name}/{flavor}", _dump(QuotaOut.model_validate(row)), None)
            await s.delete(row)

    @app.get("/v1/claims", response_model=list[ClaimOut], response_model_by_alias=True)
    async def list_claims(s: Session, token: Caller, namespace: str | None = None,
                          state: str | None = None) -> list[ClaimOut]:
        """A claim's namespace is its tenant, so a scoped viewer's filter is on namespace."""
        query = select(Claim).order_by(Claim.id)
        if token.tenant is not None:
            query = query.where(Claim.namespace == token.tenant)
        if namespace:
            query = query.where(Claim.namespace == namespace)
        if state:
            query = query.where(Claim.state == state)
        return [ClaimOut.model_validate(c) for c in await s.scalars(query)]

    @app.get("/v1/claims/{namespace}/{name}", response_model=ClaimOut, response_model_by_alias=True)
    async def get_claim(namespace: Name, name: Name, s: Session, token: Caller) -> ClaimOut:
        visible(token, namespace)
        row = await s.scalar(select(Claim).where(Claim.namespace == namespace, Claim.name == name))
        if row is None:
            raise HTTPException(404, f"claim {namespace}/{name} not found")
        return ClaimOut.model_validate(row)

    @app.get("/v1/alerts", response_model=list[AlertOut], response_model_by_alias=True)
    async def list_alerts(
        s: Session, token: Caller, kind: str | None = None, resolved: bool | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[AlertOut]:
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

    return app
