"""The admin API: tenants, quotas and claims over the SQL ledger, with bearer tokens.

Admin tokens write, viewer tokens read (a tenant-scoped viewer sees only its tenant). Every error is
application/problem+json. Every write is audited in the same transaction as the change itself.
(No `from __future__ import annotations` here: FastAPI must see the dependency aliases, which are
local to create_app, as real objects.)
"""


from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.ledger.engine import sessions
from shared.ledger.schema import AuditEntry, Claim, Cohort, Quota, Tenant
from shared.ledger.tokens import lookup_token


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, from_attributes=True)


class TenantIn(_Model):
    cohort: str | None = None
    weight: float = Field(default=1.0, gt=0)
    pending_alert_after: float | None = Field(default=None, gt=0, description="seconds")


class TenantOut(TenantIn):
    name: str


class QuotaIn(_Model):
    nominal: int = Field(default=0, ge=0)
    borrowing_limit: int | None = Field(default=None, ge=0)
    lending_limit: int | None = Field(default=None, ge=0)


class QuotaOut(QuotaIn):
    tenant: str
    flavor: str


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


@dataclass(frozen=True)
class Principal:
    """Who is calling, read once per request from the token table."""

    id: int
    role: str
    tenant: str | None


def _problem(status: int, title: str, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status, media_type="application/problem+json", headers=headers,
    )


def create_app(engine: AsyncEngine) -> FastAPI:
    factory = sessions(engine)
    app = FastAPI(title="claim-broker admin API", version="1")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return _problem(error.status_code, str(error.detail) if error.status_code < 500 else "server error",
                        error.detail, getattr(error, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        return _problem(422, "invalid request", detail)

    async def session() -> AsyncIterator[AsyncSession]:
        async with factory() as s:
            yield s

    Session = Annotated[AsyncSession, Depends(session)]

    async def caller(request: Request, s: Session) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        found = await lookup_token(s, token.strip()) if scheme.lower() == "bearer" and token else None
        principal = Principal(found.id, found.role, found.tenant) if found is not None else None
        await s.rollback()  # routes open their own transaction
        if principal is None:
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return principal

    Caller = Annotated[Principal, Depends(caller)]

    def admin(token: Principal) -> None:
        if token.role != "admin":
            raise HTTPException(403, "this token may only read")

    def visible(token: Principal, tenant: str) -> None:
        if token.tenant is not None and token.tenant != tenant:
            raise HTTPException(404, f"tenant {tenant!r} not found")

    def audit(s: AsyncSession, token: Principal, action: str, entity: str, before: Any, after: Any) -> None:
        s.add(AuditEntry(actor=f"token:{token.id}", action=action, entity=entity, before=before, after=after))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(s: Session) -> JSONResponse:
        try:
            await s.execute(text("SELECT 1"))
        except Exception as error:  # noqa: BLE001 - any failure means not ready
            return _problem(503, "ledger unavailable", str(error))
        return JSONResponse({"status": "ready"})

    @app.get("/v1/tenants", response_model=list[TenantOut], response_model_by_alias=True)
    async def list_tenants(s: Session, token: Caller) -> list[TenantOut]:
        rows = await s.scalars(select(Tenant).order_by(Tenant.name))
        return [_tenant_out(t) for t in rows if token.tenant in (None, t.name)]

    @app.get("/v1/tenants/{name}", response_model=TenantOut, response_model_by_alias=True)
    async def get_tenant(name: str, s: Session, token: Caller) -> TenantOut:
        visible(token, name)
        row = await s.get(Tenant, name)
        if row is None:
            raise HTTPException(404, f"tenant {name!r} not found")
        return _tenant_out(row)

    @app.put("/v1/tenants/{name}", response_model=TenantOut, response_model_by_alias=True)
    async def put_tenant(name: str, body: TenantIn, s: Session, token: Caller) -> TenantOut:
        admin(token)
        async with s.begin():
            if body.cohort and await s.get(Cohort, body.cohort) is None:
                s.add(Cohort(name=body.cohort))
                await s.flush()
            row = await s.get(Tenant, name)
            before = _tenant_out(row).model_dump(by_alias=True) if row else None
            if row is None:
                row = Tenant(name=name)
                s.add(row)
            row.cohort, row.weight, row.pending_alert_after_s = body.cohort, body.weight, body.pending_alert_after
            after = _tenant_out(row)
            audit(s, token, "put", f"tenant/{name}", before, after.model_dump(by_alias=True))
        return after

    @app.delete("/v1/tenants/{name}", status_code=204)
    async def delete_tenant(name: str, s: Session, token: Caller) -> None:
        admin(token)
        async with s.begin():
            row = await s.get(Tenant, name)
            if row is None:
                raise HTTPException(404, f"tenant {name!r} not found")
            for quota in await s.scalars(select(Quota).where(Quota.tenant == name)):
                await s.delete(quota)
            audit(s, token, "delete", f"tenant/{name}", _tenant_out(row).model_dump(by_alias=True), None)
            await s.delete(row)

    @app.get("/v1/tenants/{name}/quotas", response_model=list[QuotaOut], response_model_by_alias=True)
    async def list_quotas(name: str, s: Session, token: Caller) -> list[QuotaOut]:
        visible(token, name)
        rows = await s.scalars(select(Quota).where(Quota.tenant == name).order_by(Quota.flavor))
        return [QuotaOut.model_validate(q) for q in rows]

    @app.put("/v1/tenants/{name}/quotas/{flavor}", response_model=QuotaOut, response_model_by_alias=True)
    async def put_quota(name: str, flavor: str, body: QuotaIn, s: Session, token: Caller) -> QuotaOut:
        admin(token)
        async with s.begin():
            if await s.get(Tenant, name) is None:
                raise HTTPException(404, f"tenant {name!r} not found")
            row = await s.get(Quota, (name, flavor))
            before = QuotaOut.model_validate(row).model_dump(by_alias=True) if row else None
            if row is None:
                row = Quota(tenant=name, flavor=flavor)
                s.add(row)
            row.nominal, row.borrowing_limit, row.lending_limit = body.nominal, body.borrowing_limit, body.lending_limit
            after = QuotaOut.model_validate(row)
            audit(s, token, "put", f"quota/{name}/{flavor}", before, after.model_dump(by_alias=True))
        return after

    @app.delete("/v1/tenants/{name}/quotas/{flavor}", status_code=204)
    async def delete_quota(name: str, flavor: str, s: Session, token: Caller) -> None:
        admin(token)
        async with s.begin():
            row = await s.get(Quota, (name, flavor))
            if row is None:
                raise HTTPException(404, f"quota {name}/{flavor} not found")
            audit(s, token, "delete", f"quota/{name}/{flavor}",
                  QuotaOut.model_validate(row).model_dump(by_alias=True), None)
            await s.delete(row)

    @app.get("/v1/claims", response_model=list[ClaimOut], response_model_by_alias=True)
    async def list_claims(s: Session, token: Caller, namespace: str | None = None,
                          state: str | None = None) -> list[ClaimOut]:
        query = select(Claim).order_by(Claim.id)
        if token.tenant is not None:
            query = query.where(Claim.namespace == token.tenant)
        if namespace:
            query = query.where(Claim.namespace == namespace)
        if state:
            query = query.where(Claim.state == state)
        return [ClaimOut.model_validate(c) for c in await s.scalars(query)]

    @app.get("/v1/claims/{namespace}/{name}", response_model=ClaimOut, response_model_by_alias=True)
    async def get_claim(namespace: str, name: str, s: Session, token: Caller) -> ClaimOut:
        visible(token, namespace)
        row = await s.scalar(select(Claim).where(Claim.namespace == namespace, Claim.name == name))
        if row is None:
            raise HTTPException(404, f"claim {namespace}/{name} not found")
        return ClaimOut.model_validate(row)

    return app


def _tenant_out(row: Tenant) -> TenantOut:
    return TenantOut(name=row.name, cohort=row.cohort, weight=row.weight,
                     pending_alert_after=row.pending_alert_after_s)
