"""The claims that wait, and those admitted lately, as the views outside the allocator read them: the
admin API's waiting view and usage, the notifier's demand figures and its memory of who waits.

Each read selects the few columns its view needs (a queue of 10,000 claims is read whole), and the
explanation's parts are read in SQL where a whole explanation would cost JSON decoding per claim.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import String, cast, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.schema import Claim

PENDING = "Pending"
_IN_LIST = 1000  # ids per IN list: within every driver's limit on bound parameters


class PendingClaim(NamedTuple):
    id: int
    tenant: str
    reason: str | None
    spec: Any  # the stored claim document
    submitted_at: datetime
    flavors: Any  # explain.flavors: the flavors its requests accept, once the allocator explained it


class AdmittedClaim(NamedTuple):
    tenant: str
    flavor: str | None
    submitted_at: datetime
    allocated_at: datetime


class ExplainParts(NamedTuple):
    """Parts of a claim's latest Pending explanation, None where it has none."""

    quota: Any
    unsatisfiable: Any
    budget_exceeded: Any


async def pending_claims(session: AsyncSession, tenant: str | None = None) -> list[PendingClaim]:
    """Every waiting claim (with `tenant`, that tenant's)."""
    query = (select(Claim.id, Claim.namespace, Claim.reason, Claim.spec, Claim.submitted_at, Claim.explain["flavors"])
             .where(Claim.state == PENDING))
    if tenant is not None:
        query = query.where(Claim.namespace == tenant)
    return [PendingClaim(*row) for row in await session.execute(query)]


async def admitted_since(session: AsyncSession, since: datetime, tenant: str | None = None) -> list[AdmittedClaim]:
    """Claims allocated at or after `since` (with `tenant`, that tenant's)."""
    query = (select(Claim.namespace, Claim.flavor, Claim.submitted_at, Claim.allocated_at)
             .where(Claim.allocated_at >= since))
    if tenant is not None:
        query = query.where(Claim.namespace == tenant)
    admitted = []
    for tenant_name, flavor, submitted, allocated in await session.execute(query):
        assert allocated is not None  # the query's condition
        admitted.append(AdmittedClaim(tenant_name, flavor, submitted, allocated))
    return admitted


async def explain_parts(session: AsyncSession, ids: Sequence[int]) -> dict[int, ExplainParts]:
    """The quota, unsatisfiable and budgetExceeded parts of these claims' explanations, by claim id."""
    explain = Claim.explain
    parts: dict[int, ExplainParts] = {}
    for start in range(0, len(ids), _IN_LIST):
        query = (select(Claim.id, explain["quota"], explain["unsatisfiable"], explain["budgetExceeded"])
                 .where(Claim.id.in_(ids[start:start + _IN_LIST])))
        parts.update({claim_id: ExplainParts(quota, unsatisfiable, budget)
                      for claim_id, quota, unsatisfiable, budget in await session.execute(query)})
    return parts


async def pending_documents(session: AsyncSession) -> list[tuple[str, Any, Any]]:
    """(tenant, claim document, explanation) of every waiting claim."""
    return [(ns, spec, explain) for ns, spec, explain in await session.execute(
        select(Claim.namespace, Claim.spec, Claim.explain).where(Claim.state == PENDING))]


async def accepted_flavor_counts(session: AsyncSession) -> list[tuple[list[Any] | None, int]]:
    """Waiting claims counted by the flavor list their explanation accepts (None: not explained yet).
    Counted in SQL: reading every waiting claim's whole explanation took seconds of JSON decoding at 7,500
    waiting claims, inside the event loop the allocator shares under `up`."""
    accepted = Claim.explain["flavors"].as_string()
    return [(_flavor_list(text), int(n)) for text, n in await session.execute(
        select(accepted, func.count()).where(Claim.state == PENDING).group_by(accepted))]


def _flavor_list(text: str | None) -> list[Any] | None:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, list) else None


async def any_pending_mentioning(session: AsyncSession, fragment: str) -> bool:
    """Whether a waiting claim's document holds `fragment` anywhere (a device class's name, say)."""
    found = await session.scalar(select(Claim.id).where(Claim.state == PENDING,
                                                        cast(Claim.spec, String).contains(fragment)).limit(1))
    return found is not None


async def waiting_since(session: AsyncSession) -> list[tuple[str, str, float, str]]:
    """(tenant, name, since, reason) of every waiting claim, `since` its last update as a Unix time."""
    rows = await session.execute(select(Claim.namespace, Claim.name, Claim.updated_at, Claim.reason)
                                 .where(Claim.state == PENDING))
    return [(ns, name, _ts(updated), reason or "") for ns, name, updated, reason in rows]


def _ts(moment: datetime) -> float:
    return (moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment).timestamp()
