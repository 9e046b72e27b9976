"""The quota configuration in the ledger, as the pure model in shared/admission/quota.py has it.

`load_quota_config` is what the allocator reads at every decision cycle (four small SELECTs, no joins),
so a write through the admin API reaches the next decision without a restart. `apply_quota_config` makes
the ledger equal a whole Quotas document (import): it writes only the rows that differ, and audits each
one in the caller's transaction, so a rolled back transaction is a dry run with the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.admission.quota import Flavor, QuotaConfig, QuotaLimit, TenantQuota, merge_flavors
from shared.ledger.schema import AuditEntry, Cohort, Quota, Tenant
from shared.ledger.schema import Flavor as FlavorRow


@dataclass(frozen=True)
class Change:
    """One ledger row an import creates, updates or deletes; before/after read like the API's JSON."""

    kind: str  # cohort | flavor | tenant | quota
    entity: str  # as in the audit log: "quota/vision/H100"
    action: str  # create | update | delete
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "entity": self.entity, "action": self.action, "before": self.before,
                "after": self.after}


# Row shapes, camelCase like the admin API's responses, shared by the API's audit rows and by imports.

def cohort_json(name: str) -> dict[str, Any]:
    return {"name": name}


def flavor_json(row: FlavorRow) -> dict[str, Any]:
    return {"name": row.name, "selector": row.selector, "value": float(row.value), "position": row.position}


def tenant_json(row: Tenant) -> dict[str, Any]:
    return {"name": row.name, "cohort": row.cohort, "weight": float(row.weight),
            "pendingAlertAfter": row.pending_alert_after_s, "adminAccess": bool(row.admin_access),
            "maxPending": row.max_pending, "minRuntime": row.min_runtime_s,
            "maxPreemptionsPerMinute": row.max_preemptions_per_minute}


def quota_json(row: Quota) -> dict[str, Any]:
    return {"tenant": row.tenant, "flavor": row.flavor, "nominal": row.nominal,
            "borrowingLimit": row.borrowing_limit, "lendingLimit": row.lending_limit}


async def load_quota_config(session: AsyncSession) -> QuotaConfig:
    """Flavors in `position` order (then name) merged with the built-ins, cohorts, tenants, quotas. Read
    as plain rows: building ORM objects for a few hundred quotas took most of the read, every cycle."""
    listed = tuple(Flavor(name, selector, float(value)) for name, selector, value in await session.execute(
        select(FlavorRow.name, FlavorRow.selector, FlavorRow.value).order_by(FlavorRow.position, FlavorRow.name)))
    cohorts = tuple(await session.scalars(select(Cohort.name).order_by(Cohort.name)))
    limits: dict[str, dict[str, QuotaLimit]] = {}
    for tenant, flavor, nominal, borrowing, lending in await session.execute(
            select(Quota.tenant, Quota.flavor, Quota.nominal, Quota.borrowing_limit, Quota.lending_limit)
            .order_by(Quota.tenant, Quota.flavor)):
        limits.setdefault(tenant, {})[flavor] = QuotaLimit(nominal, borrowing, lending)
    tenants = {name: TenantQuota(name, cohort, float(weight), pending_after, limits.get(name, {}), bool(admin),
                                 max_pending, min_runtime, most)
               for name, cohort, weight, pending_after, admin, max_pending, min_runtime, most in await session.execute(
                   select(Tenant.name, Tenant.cohort, Tenant.weight, Tenant.pending_alert_after_s,
                          Tenant.admin_access, Tenant.max_pending, Tenant.min_runtime_s,
                          Tenant.max_preemptions_per_minute).order_by(Tenant.name))}
    return QuotaConfig(merge_flavors(listed), cohorts, tenants, listed)


def _audit(session: AsyncSession, actor: str, change: Change) -> None:
    action = "delete" if change.action == "delete" else "put"
    session.add(AuditEntry(actor=actor, action=action, entity=change.entity, before=change.before,
                           after=change.after))


def _diff(kind: str, entity: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> Change | None:
    if before == after:
        return None
    action = "create" if before is None else "delete" if after is None else "update"
    return Change(kind, entity, action, before, after)


async def apply_quota_config(session: AsyncSession, config: QuotaConfig, actor: str) -> list[Change]:
    """Make the ledger hold exactly `config`: rows it does not name (flavors, cohorts, tenants, quotas)
    are deleted. Runs inside the caller's transaction; returns the changes in the order they were made
    (cohorts and flavors created first, deletions of what tenants referred to last)."""
    changes: list[Change] = []

    def note(change: Change | None) -> bool:
        if change is not None:
            changes.append(change)
            _audit(session, actor, change)
        return change is not None

    # Cohorts first: tenants refer to them.
    existing_cohorts = set(await session.scalars(select(Cohort.name)))
    for name in config.cohorts:
        if name not in existing_cohorts:
            session.add(Cohort(name=name))
            note(_diff("cohort", f"cohort/{name}", None, cohort_json(name)))
    await session.flush()

    flavors = {f.name: f for f in await session.scalars(select(FlavorRow))}
    wanted = {f.name for f in config.listed_flavors}
    for position, flavor in enumerate(config.listed_flavors):
        row = flavors.get(flavor.name)
        before = flavor_json(row) if row is not None else None
        if row is None:
            row = FlavorRow(name=flavor.name)
            session.add(row)
        row.selector, row.value, row.position = flavor.selector, float(flavor.value), position
        note(_diff("flavor", f"flavor/{flavor.name}", before, flavor_json(row)))
    for gone in sorted(set(flavors) - wanted):
        note(_diff("flavor", f"flavor/{gone}", flavor_json(flavors[gone]), None))
        await session.delete(flavors[gone])

    tenants = {t.name: t for t in await session.scalars(select(Tenant))}
    quotas = {(q.tenant, q.flavor): q for q in await session.scalars(select(Quota))}
    for name in sorted(config.tenants):
        wanted_tenant = config.tenants[name]
        row_t = tenants.get(name)
        before = tenant_json(row_t) if row_t is not None else None
        if row_t is None:
            row_t = Tenant(name=name)
            session.add(row_t)
        row_t.cohort, row_t.weight = wanted_tenant.cohort, float(wanted_tenant.weight)
        row_t.pending_alert_after_s = wanted_tenant.pending_alert_after
        row_t.admin_access = wanted_tenant.admin_access
        row_t.max_pending = wanted_tenant.max_pending
        row_t.min_runtime_s = wanted_tenant.min_runtime
        row_t.max_preemptions_per_minute = wanted_tenant.max_preemptions_per_minute
        note(_diff("tenant", f"tenant/{name}", before, tenant_json(row_t)))
        await session.flush()
        changes.extend(await _apply_limits(session, actor, name, wanted_tenant.quotas, quotas))
    for (tenant, flavor_name), row_q in sorted(quotas.items()):
        if tenant not in config.tenants:
            note(_diff("quota", f"quota/{tenant}/{flavor_name}", quota_json(row_q), None))
            await session.delete(row_q)
    for name in sorted(set(tenants) - set(config.tenants)):
        note(_diff("tenant", f"tenant/{name}", tenant_json(tenants[name]), None))
        await session.delete(tenants[name])
    await session.flush()
    for name in sorted(existing_cohorts - set(config.cohorts)):
        row_c = await session.get(Cohort, name)
        if row_c is not None:
            note(_diff("cohort", f"cohort/{name}", cohort_json(name), None))
            await session.delete(row_c)
    await session.flush()
    return changes


async def _apply_limits(session: AsyncSession, actor: str, tenant: str, wanted: Mapping[str, QuotaLimit],
                        existing: dict[tuple[str, str], Quota]) -> list[Change]:
    changes: list[Change] = []
    for flavor in sorted(wanted):
        limit = wanted[flavor]
        row = existing.get((tenant, flavor))
        before = quota_json(row) if row is not None else None
        if row is None:
            row = Quota(tenant=tenant, flavor=flavor)
            session.add(row)
        row.nominal, row.borrowing_limit, row.lending_limit = limit.nominal, limit.borrowing_limit, limit.lending_limit
        change = _diff("quota", f"quota/{tenant}/{flavor}", before, quota_json(row))
        if change is not None:
            changes.append(change)
            _audit(session, actor, change)
    for (owner, flavor), row in sorted(existing.items()):
        if owner == tenant and flavor not in wanted:
            change = Change("quota", f"quota/{tenant}/{flavor}", "delete", quota_json(row), None)
            changes.append(change)
            _audit(session, actor, change)
            await session.delete(row)
    return changes
