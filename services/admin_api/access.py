"""Who calls the admin API and what it may reach: the bearer token read once per request, an admin's
writes, a tenant-scoped viewer's reach, the session each route reads through, and the audit entry each write
leaves. The session factory lives on `app.state`, so these dependencies are module-level objects that the
routers of every module can use. (No `from __future__ import annotations`: FastAPI must see the dependency
aliases as real objects.)"""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shared.ledger import audit as audit_log
from shared.ledger.handles import AsyncSession
from shared.ledger.tokens import lookup_token


@dataclass(frozen=True)
class Principal:
    """Who is calling, read once per request from the token table."""

    id: int
    role: str
    tenant: str | None

    @property
    def actor(self) -> str:
        return f"token:{self.id}"


bearer = HTTPBearer(auto_error=False, description="an API token from `claimbroker token create`")


async def session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as s:
        yield s


Session = Annotated[AsyncSession, Depends(session)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


async def caller(s: Session, credentials: Credentials) -> Principal:
    found = await lookup_token(s, credentials.credentials) if credentials is not None else None
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
    """A scoped viewer gets 404, not 403, for other tenants: it must not learn which ones exist."""
    if token.tenant is not None and token.tenant != tenant:
        raise HTTPException(404, f"tenant {tenant!r} not found")


def audit(s: AsyncSession, token: Principal, action: str, entity: str,
          before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
    audit_log.record(s, token.actor, action, entity, before, after)
