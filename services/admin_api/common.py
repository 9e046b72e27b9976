"""What every route module shares: camelCase models, problem responses, the session and the caller.

The session factory lives on `app.state`, so the dependencies below are module-level objects that
routers in several modules can use. (No `from __future__ import annotations`: FastAPI must see the
dependency aliases as real objects.)
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator, BaseModel, ConfigDict, field_validator
from pydantic.alias_generators import to_camel

from shared.dra import model as dra
from shared.ledger import audit as audit_log
from shared.ledger.handles import AsyncSession
from shared.ledger.tokens import lookup_token

PROBLEM = "application/problem+json"
INT32_MAX = 2**31 - 1  # the ledger's INTEGER columns (quotas, positions) are 32-bit on PostgreSQL
Name = Annotated[str, Path(min_length=1, max_length=253)]


def dns_label(value: str) -> str:
    """Tenants are namespaces and cohorts share their rule: a name that could never submit is refused
    when it is created, not found later."""
    if not dra.is_dns_label(value):
        raise ValueError(f"{dra.shown(value)} {dra.DNS_LABEL_RULE}")
    return value


_LABEL_SCHEMA = {"pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
DnsLabel = Annotated[str, AfterValidator(dns_label)]
# For the routes that create a tenant or cohort; reads and deletes take any Name, so that a row written
# before this rule can still be seen and removed.
LabelName = Annotated[str, Path(json_schema_extra=_LABEL_SCHEMA), AfterValidator(dns_label)]


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, from_attributes=True)


class Input(Model):
    """Unknown fields are refused, so a misspelt limit is a 422 rather than a silently ignored one; no text
    field may hold what a text column refuses (PostgreSQL: NUL; any UTF-8 column: a lone surrogate)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        if isinstance(value, str) and (problem := dra.text_problem(value)) is not None:
            raise ValueError(problem)
        return value


def _aware(value: datetime) -> datetime:
    """SQLite hands back naive UTC timestamps, PostgreSQL aware ones; clients get the same from both."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


Stamp = Annotated[datetime, AfterValidator(_aware)]


@dataclass(frozen=True)
class Principal:
    """Who is calling, read once per request from the token table."""

    id: int
    role: str
    tenant: str | None

    @property
    def actor(self) -> str:
        return f"token:{self.id}"


class ProblemOut(BaseModel):
    """RFC 9457 problem details, as every error of this API is written."""

    type: str = "about:blank"
    title: str
    status: int
    detail: Any


def problem_doc(description: str) -> dict[str, Any]:
    return {"description": description, "content": {PROBLEM: {"schema": ProblemOut.model_json_schema()}}}


# Documented on every /v1 route, so clients (and schemathesis) know the error shape.
PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: problem_doc("no token, or one the ledger does not know"),
    403: problem_doc("a viewer token tried to write, or to read the audit log"),
    404: problem_doc("not found (a scoped viewer also gets this for other tenants)"),
    422: problem_doc("the request is invalid; the detail names the field"),
}


def problem(status: int, title: str, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status, media_type=PROBLEM, headers=headers,
    )


def phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


class Problem(HTTPException):
    """An error whose title is short and whose detail carries the specifics (CEL's message, known names)."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(status, detail)
        self.title = title


async def storable_parameters(request: Request) -> None:
    """Every route's path and query parameters, before anything reads them: a NUL (or a lone surrogate)
    would reach a query that the database refuses with a 500. Declared or not, such a parameter is a 422."""
    found = [(f"path.{key}", value) for key, value in request.path_params.items() if isinstance(value, str)]
    found += [(f"query.{key}", value) for key, value in request.query_params.multi_items()]
    found += [(f"query.{key}", key) for key in request.query_params]
    for where, value in found:
        if (problem := dra.text_problem(value)) is not None:
            raise Problem(422, "invalid request", f"{dra.shown(where)[1:-1]}: {problem}")


def dump(model: BaseModel | None) -> dict[str, Any] | None:
    """Audit rows hold what a client would have seen, camelCase, so before/after read like the API."""
    return model.model_dump(mode="json", by_alias=True) if model is not None else None


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
