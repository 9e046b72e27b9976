"""The admin API's fields and bodies: camelCase models, bodies that refuse unknown fields and text no column
can hold, names that could submit, timestamps alike from SQLite and PostgreSQL, and parameters checked before
any route reads them. (No `from __future__ import annotations`: FastAPI must see the aliases as real objects.)
"""

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Path, Request
from pydantic import AfterValidator, BaseModel, ConfigDict, field_validator
from pydantic.alias_generators import to_camel

from services.admin_api.problems import Problem
from shared.dra import model as dra

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
