"""Tenants and cohorts one row at a time, as the admin API edits them (a whole Quotas document goes
through quota_store). Nothing here commits or audits: the caller writes the audit entry in the same
transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.quota_store import quota_json, tenant_json
from shared.ledger.schema import Cohort, Quota, Tenant


@dataclass(frozen=True)
class TenantSettings:
    """Every column of a tenant but its name."""

    cohort: str | None
    weight: float
    pending_alert_after_s: float | None
    admin_access: bool
    max_pending: int | None
    min_runtime_s: float | None
    max_preemptions_per_minute: int | None
    gang_reserve_after_s: float | None = None  # None: the broker's default; 0: off


async def tenants(session: AsyncSession, only: str | None = None) -> list[Tenant]:
    """By name; with `only`, that tenant alone (if it exists)."""
    query = select(Tenant).order_by(Tenant.name)
    if only is not None:
        query = query.where(Tenant.name == only)
    return list(await session.scalars(query))


async def tenant(session: AsyncSession, name: str) -> Tenant | None:
    return await session.get(Tenant, name)


async def put_tenant(session: AsyncSession, name: str,
                     settings: TenantSettings) -> tuple[dict[str, Any] | None, Tenant]:
    """Create or replace; a cohort named for the first time is created with it. The tenant's JSON before
    (None: it is new) and its row."""
    if settings.cohort is not None and await add_cohort(session, settings.cohort):
        await session.flush()
    row = await session.get(Tenant, name)
    before = tenant_json(row) if row is not None else None
    if row is None:
        row = Tenant(name=name)
        session.add(row)
    row.cohort, row.weight = settings.cohort, settings.weight
    row.pending_alert_after_s = settings.pending_alert_after_s
    row.admin_access = settings.admin_access
    row.max_pending = settings.max_pending
    row.min_runtime_s = settings.min_runtime_s
    row.max_preemptions_per_minute = settings.max_preemptions_per_minute
    row.gang_reserve_after_s = settings.gang_reserve_after_s
    return before, row


async def delete_tenant(session: AsyncSession, row: Tenant) -> list[dict[str, Any]]:
    """The tenant and its quotas, deleted; the quotas' JSON by flavor, for the audit log (each is recorded
    there rather than vanishing by cascade)."""
    quotas = list(await session.scalars(select(Quota).where(Quota.tenant == row.name).order_by(Quota.flavor)))
    gone = [quota_json(quota) for quota in quotas]
    for quota in quotas:
        await session.delete(quota)
    await session.delete(row)
    return gone


async def pending_alert_after(session: AsyncSession) -> dict[str, float]:
    """Each tenant's own pendingAlertAfter (seconds), where it has one."""
    rows = await session.execute(select(Tenant.name, Tenant.pending_alert_after_s)
                                 .where(Tenant.pending_alert_after_s.is_not(None)))
    return {name: float(after) for name, after in rows if after is not None}


# --- cohorts ------------------------------------------------------------------------------------------


async def cohort_names(session: AsyncSession) -> list[str]:
    return list(await session.scalars(select(Cohort.name).order_by(Cohort.name)))


async def cohort_exists(session: AsyncSession, name: str) -> bool:
    return await session.get(Cohort, name) is not None


async def add_cohort(session: AsyncSession, name: str) -> bool:
    """Whether it was created (False: it exists)."""
    if await cohort_exists(session, name):
        return False
    session.add(Cohort(name=name))
    return True


async def delete_cohort(session: AsyncSession, name: str) -> None:
    row = await session.get(Cohort, name)
    if row is not None:
        await session.delete(row)


async def members(session: AsyncSession, cohort: str) -> list[str]:
    """The tenants of a cohort, by name."""
    return list(await session.scalars(select(Tenant.name).where(Tenant.cohort == cohort).order_by(Tenant.name)))


async def tenant_cohorts(session: AsyncSession) -> list[tuple[str, str | None]]:
    """(tenant, its cohort or None) of every tenant, by name."""
    return [(name, cohort) for name, cohort in await session.execute(
        select(Tenant.name, Tenant.cohort).order_by(Tenant.name))]
