"""Tenants and cohorts one row at a time, as the admin API edits them (a whole Quotas document goes
through quota_store). Nothing here commits or audits: the caller writes the audit entry in the same
transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.admission.quota import QuotaLimit
from shared.ledger.quota_store import cohort_json, cohort_quota_json, quota_json, tenant_json
from shared.ledger.schema import Cohort, CohortQuotaRow, Quota, Tenant


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


async def delete_cohort(session: AsyncSession, name: str) -> list[dict[str, Any]]:
    """The cohort and its own quotas, deleted; the quotas' JSON by flavor, for the audit log."""
    own = list(await session.scalars(select(CohortQuotaRow).where(CohortQuotaRow.cohort == name)
                                     .order_by(CohortQuotaRow.flavor)))
    gone = [cohort_quota_json(quota) for quota in own]
    for quota in own:
        await session.delete(quota)
    row = await session.get(Cohort, name)
    if row is not None:
        await session.flush()  # its quotas first: their rows refer to it
        await session.delete(row)
    return gone


async def cohort_parents(session: AsyncSession) -> dict[str, str | None]:
    """Every cohort's parent (None: a top cohort), by name."""
    return {name: parent for name, parent in await session.execute(
        select(Cohort.name, Cohort.parent).order_by(Cohort.name))}


async def cohort_quotas(session: AsyncSession, cohort: str | None = None) -> dict[str, dict[str, QuotaLimit]]:
    """Per cohort, its own quotas by flavor; with `cohort`, that cohort's only."""
    query = select(CohortQuotaRow.cohort, CohortQuotaRow.flavor, CohortQuotaRow.nominal,
                   CohortQuotaRow.borrowing_limit, CohortQuotaRow.lending_limit) \
        .order_by(CohortQuotaRow.cohort, CohortQuotaRow.flavor)
    if cohort is not None:
        query = query.where(CohortQuotaRow.cohort == cohort)
    out: dict[str, dict[str, QuotaLimit]] = {}
    for name, flavor, nominal, borrowing, lending in await session.execute(query):
        out.setdefault(name, {})[flavor] = QuotaLimit(nominal, borrowing, lending)
    return out


def cohort_state_json(name: str, parent: str | None, own: dict[str, QuotaLimit]) -> dict[str, Any]:
    """A cohort as the audit log records it: its name, parent and own quotas (as the API has them)."""
    out = cohort_json(name, parent)
    out["quotas"] = {flavor: {"nominal": limit.nominal, "borrowingLimit": limit.borrowing_limit,
                              "lendingLimit": limit.lending_limit} for flavor, limit in sorted(own.items())}
    return out


def ancestry_problem(parents: dict[str, str | None], name: str, parent: str | None) -> str | None:
    """Why `name` may not have `parent` in this tree, naming the cohorts: an unknown parent, or a cycle."""
    if parent is None:
        return None
    if parent != name and parent not in parents:
        return f"cohort {name!r} names parent {parent!r}, which is no cohort; create it first"
    path: list[str] = [name]
    at: str | None = parent
    while at is not None:
        if at in path:
            return f"a cohort may not be its own ancestor: {' -> '.join(path + [at])}"
        path.append(at)
        at = parents.get(at)
    return None


async def put_cohort(session: AsyncSession, name: str, parent: str | None,
                     own: dict[str, QuotaLimit] | None) -> None:
    """Create or replace: its parent, and its own quotas when `own` is given (None: kept as they are).
    The caller checked the parent (`ancestry_problem`) and the flavors."""
    row = await session.get(Cohort, name)
    if row is None:
        row = Cohort(name=name)
        session.add(row)
        await session.flush()
    row.parent = parent
    if own is None:
        return
    held = {q.flavor: q for q in await session.scalars(select(CohortQuotaRow).where(CohortQuotaRow.cohort == name))}
    for flavor, quota in held.items():
        if flavor not in own:
            await session.delete(quota)
    for flavor, limit in own.items():
        found = held.get(flavor)
        quota = found if found is not None else CohortQuotaRow(cohort=name, flavor=flavor)
        if found is None:
            session.add(quota)
        quota.nominal, quota.borrowing_limit = limit.nominal, limit.borrowing_limit
        quota.lending_limit = limit.lending_limit


async def children(session: AsyncSession, cohort: str) -> list[str]:
    """The cohorts whose parent is `cohort`, by name."""
    return list(await session.scalars(select(Cohort.name).where(Cohort.parent == cohort).order_by(Cohort.name)))


async def members(session: AsyncSession, cohort: str) -> list[str]:
    """The tenants of a cohort, by name."""
    return list(await session.scalars(select(Tenant.name).where(Tenant.cohort == cohort).order_by(Tenant.name)))


async def tenant_cohorts(session: AsyncSession) -> list[tuple[str, str | None]]:
    """(tenant, its cohort or None) of every tenant, by name."""
    return [(name, cohort) for name, cohort in await session.execute(
        select(Tenant.name, Tenant.cohort).order_by(Tenant.name))]
