"""Quotas one row at a time, as the admin API edits them (a whole Quotas document goes through
quota_store). Nothing here commits or audits: the caller writes the audit entry in the same transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.quota_store import quota_json
from shared.ledger.schema import CohortQuotaRow, Quota


async def quotas(session: AsyncSession, tenant: str | None = None) -> list[Quota]:
    """By tenant and flavor; with `tenant`, that tenant's only."""
    query = select(Quota).order_by(Quota.tenant, Quota.flavor)
    if tenant is not None:
        query = query.where(Quota.tenant == tenant)
    return list(await session.scalars(query))


async def quota(session: AsyncSession, tenant: str, flavor: str) -> Quota | None:
    return await session.get(Quota, (tenant, flavor))


async def put_quota(session: AsyncSession, tenant: str, flavor: str, nominal: int, borrowing_limit: int | None,
                    lending_limit: int | None) -> tuple[dict[str, Any] | None, Quota]:
    """Create or replace. The quota's JSON before (None: it is new) and its row."""
    row = await session.get(Quota, (tenant, flavor))
    before = quota_json(row) if row is not None else None
    if row is None:
        row = Quota(tenant=tenant, flavor=flavor)
        session.add(row)
    row.nominal, row.borrowing_limit = nominal, borrowing_limit
    row.lending_limit = lending_limit
    return before, row


async def delete_quota(session: AsyncSession, row: Quota) -> None:
    await session.delete(row)


async def tenants_using(session: AsyncSession, flavor: str) -> list[str]:
    """The tenants with a quota of `flavor`, by name."""
    return list(await session.scalars(select(Quota.tenant).where(Quota.flavor == flavor).order_by(Quota.tenant)))


async def cohorts_using(session: AsyncSession, flavor: str) -> list[str]:
    """The cohorts with a quota of their own of `flavor`, by name."""
    return list(await session.scalars(select(CohortQuotaRow.cohort).where(CohortQuotaRow.flavor == flavor)
                                      .order_by(CohortQuotaRow.cohort)))
