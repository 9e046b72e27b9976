"""Claims as people look them up: a page of them by filters, one by its name, and the statuses it was given."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.schema import Claim, ClaimEvent


@dataclass(frozen=True)
class ClaimFilter:
    """Which claims a page holds; an empty or None field does not filter. `tenant` is a scoped reader's
    own namespace, `namespace` the one asked for: both apply."""

    tenant: str | None = None
    namespace: str | None = None
    state: str | None = None
    node: str | None = None


async def claim_page(session: AsyncSession, where: ClaimFilter, limit: int,
                     after: int | None = None) -> tuple[list[Claim], int | None]:
    """Up to `limit` claims by id, past the id `after`, and the cursor of the next page (None on the last)."""
    query = select(Claim).order_by(Claim.id).limit(limit + 1)
    if where.tenant is not None:
        query = query.where(Claim.namespace == where.tenant)
    if where.namespace:
        query = query.where(Claim.namespace == where.namespace)
    if where.state:
        query = query.where(Claim.state == where.state)
    if where.node:
        query = query.where(Claim.node == where.node)
    if after is not None:
        query = query.where(Claim.id > after)
    rows = list(await session.scalars(query))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, rows[-1].id if more else None


async def claim_named(session: AsyncSession, namespace: str, name: str) -> Claim | None:
    found: Claim | None = await session.scalar(select(Claim).where(Claim.namespace == namespace, Claim.name == name))
    return found


async def claim_events(session: AsyncSession, claim_id: int) -> list[ClaimEvent]:
    """Every status the claim was given, oldest first."""
    return list(await session.scalars(select(ClaimEvent).where(ClaimEvent.claim_id == claim_id)
                                      .order_by(ClaimEvent.sequence, ClaimEvent.id)))
