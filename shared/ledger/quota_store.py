"""The quota configuration in the ledger, as the pure model in shared/admission/quota.py has it.

`load_quota_config` is what the allocator reads when the configuration moved (config_revision; six small
SELECTs, no joins), so a write through the admin API reaches the next decision without a restart.
`quota_changes` works out what making the ledger's rows (`read_quota_rows`) equal a whole Quotas document
(import) would change, writing nothing: a dry run's answer. `apply_quota_config` writes exactly that plan,
a statement per kind of change rather than per row, and audits each change in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.admission.quota import CohortQuota, Flavor, QuotaConfig, QuotaLimit, TenantQuota, merge_flavors
from shared.ledger.schema import AuditEntry, Cohort, CohortQuotaRow, ConfigRevision, Quota, QuotaSettings, Tenant
from shared.ledger.schema import Flavor as FlavorRow


@dataclass(frozen=True)
class Change:
    """One ledger row an import creates, updates or deletes; before/after read like the API's JSON."""

    kind: str  # cohort | flavor | tenant | quota | cohort-quota | fair-sharing
    entity: str  # as in the audit log: "quota/vision/H100", "cohort-quota/research/H100", "fair-sharing"
    action: str  # create | update | delete
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "entity": self.entity, "action": self.action, "before": self.before,
                "after": self.after}


# Row shapes, camelCase like the admin API's responses, shared by the API's audit rows and by imports. The
# column each key comes from is named once, so an import can write a row back from its `after`.
TENANT_COLUMNS = {"name": "name", "cohort": "cohort", "weight": "weight", "pendingAlertAfter": "pending_alert_after_s",
                  "adminAccess": "admin_access", "maxPending": "max_pending", "minRuntime": "min_runtime_s",
                  "maxPreemptionsPerMinute": "max_preemptions_per_minute", "gangReserveAfter": "gang_reserve_after_s"}
QUOTA_COLUMNS = {"tenant": "tenant", "flavor": "flavor", "nominal": "nominal", "borrowingLimit": "borrowing_limit",
                 "lendingLimit": "lending_limit"}
FLAVOR_COLUMNS = {"name": "name", "selector": "selector", "value": "value", "position": "position"}
COHORT_COLUMNS = {"name": "name", "parent": "parent"}
COHORT_QUOTA_COLUMNS = {"cohort": "cohort", "flavor": "flavor", "nominal": "nominal",
                        "borrowingLimit": "borrowing_limit", "lendingLimit": "lending_limit"}
FAIR_SHARING_ENTITY = "fair-sharing"


def cohort_json(name: str, parent: str | None = None) -> dict[str, Any]:
    return {"name": name, "parent": parent}


def cohort_quota_json(row: Any) -> dict[str, Any]:
    return {key: getattr(row, column) for key, column in COHORT_QUOTA_COLUMNS.items()}


def fair_sharing_json(half_life: float) -> dict[str, Any]:
    """The fair-sharing settings as the API has them: halfLife in seconds (0: off)."""
    return {"halfLife": float(half_life)}


def flavor_json(row: Any) -> dict[str, Any]:
    return {"name": row.name, "selector": row.selector, "value": float(row.value), "position": row.position}


def tenant_json(row: Any) -> dict[str, Any]:
    """A Tenant row, or any object with its columns as attributes (a selected Row)."""
    out = {key: getattr(row, column) for key, column in TENANT_COLUMNS.items()}
    out["weight"], out["adminAccess"] = float(out["weight"]), bool(out["adminAccess"])
    return out


def quota_json(row: Any) -> dict[str, Any]:
    return {key: getattr(row, column) for key, column in QUOTA_COLUMNS.items()}


async def load_quota_config(session: AsyncSession) -> QuotaConfig:
    """Flavors in `position` order (then name) merged with the built-ins, cohorts (with their parents and
    quotas: the tree), tenants, quotas, the half-life. Read as plain rows: building ORM objects for a few
    hundred quotas took most of the read, every cycle."""
    listed = tuple(Flavor(name, selector, float(value)) for name, selector, value in await session.execute(
        select(FlavorRow.name, FlavorRow.selector, FlavorRow.value).order_by(FlavorRow.position, FlavorRow.name)))
    parents = {name: parent for name, parent in await session.execute(
        select(Cohort.name, Cohort.parent).order_by(Cohort.name))}
    cohorts = tuple(parents)
    cohort_limits: dict[str, dict[str, QuotaLimit]] = {}
    for cohort, flavor, nominal, borrowing, lending in await session.execute(
            select(CohortQuotaRow.cohort, CohortQuotaRow.flavor, CohortQuotaRow.nominal,
                   CohortQuotaRow.borrowing_limit, CohortQuotaRow.lending_limit)
            .order_by(CohortQuotaRow.cohort, CohortQuotaRow.flavor)):
        cohort_limits.setdefault(cohort, {})[flavor] = QuotaLimit(nominal, borrowing, lending)
    tree = {name: CohortQuota(name, parent, cohort_limits.get(name, {})) for name, parent in parents.items()
            if parent is not None or name in cohort_limits}  # as parse_quotas keeps it: nodes that nest
    limits: dict[str, dict[str, QuotaLimit]] = {}
    for tenant, flavor, nominal, borrowing, lending in await session.execute(
            select(Quota.tenant, Quota.flavor, Quota.nominal, Quota.borrowing_limit, Quota.lending_limit)
            .order_by(Quota.tenant, Quota.flavor)):
        limits.setdefault(tenant, {})[flavor] = QuotaLimit(nominal, borrowing, lending)
    tenants = {name: TenantQuota(name, cohort, float(weight), pending_after, limits.get(name, {}), bool(admin),
                                 max_pending, min_runtime, most, reserve_after)
               for name, cohort, weight, pending_after, admin, max_pending, min_runtime, most, reserve_after
               in await session.execute(
                   select(Tenant.name, Tenant.cohort, Tenant.weight, Tenant.pending_alert_after_s,
                          Tenant.admin_access, Tenant.max_pending, Tenant.min_runtime_s,
                          Tenant.max_preemptions_per_minute, Tenant.gang_reserve_after_s).order_by(Tenant.name))}
    return QuotaConfig(merge_flavors(listed), cohorts, tenants, listed, cohort_tree=tree,
                       half_life=await half_life(session))


async def half_life(session: AsyncSession) -> float:
    """fairSharing.halfLife in seconds (0: past use off)."""
    return float(await session.scalar(select(QuotaSettings.half_life_s).where(QuotaSettings.id == 1)) or 0.0)


async def set_half_life(session: AsyncSession, seconds: float) -> float:
    """Set fairSharing.halfLife; the one before. Nothing commits or audits here."""
    row = await session.get(QuotaSettings, 1)
    if row is None:  # a ledger whose row someone deleted: it comes back
        row = QuotaSettings(id=1, half_life_s=0.0)
        session.add(row)
    before = float(row.half_life_s or 0.0)
    row.half_life_s = float(seconds)
    return before


async def config_revision(session: AsyncSession) -> int | None:
    """Where the quota configuration stands: moved by the database on every change (migration 0015)."""
    return await session.scalar(select(ConfigRevision.revision).where(ConfigRevision.id == 1))


class QuotaConfigCache:
    """The quota configuration as last read, read again only when `config_revision` moved: one query a
    transaction instead of four, and the same object from cycle to cycle while nothing changed (the decision
    core then recognises it by identity)."""

    def __init__(self) -> None:
        self.revision: int | None = None
        self.config: QuotaConfig | None = None

    async def load(self, session: AsyncSession) -> QuotaConfig:
        revision = await config_revision(session)
        if self.config is None or revision is None or revision != self.revision:
            self.config, self.revision = await load_quota_config(session), revision
        return self.config


def _diff(kind: str, entity: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> Change | None:
    if before == after:
        return None
    action = "create" if before is None else "delete" if after is None else "update"
    return Change(kind, entity, action, before, after)


def _wanted_tenant(tenant: TenantQuota) -> dict[str, Any]:
    return {"name": tenant.name, "cohort": tenant.cohort, "weight": float(tenant.weight),
            "pendingAlertAfter": tenant.pending_alert_after, "adminAccess": bool(tenant.admin_access),
            "maxPending": tenant.max_pending, "minRuntime": tenant.min_runtime,
            "maxPreemptionsPerMinute": tenant.max_preemptions_per_minute,
            "gangReserveAfter": tenant.gang_reserve_after}


def _wanted_quota(tenant: str, flavor: str, limit: QuotaLimit) -> dict[str, Any]:
    return {"tenant": tenant, "flavor": flavor, "nominal": limit.nominal, "borrowingLimit": limit.borrowing_limit,
            "lendingLimit": limit.lending_limit}


@dataclass(frozen=True)
class QuotaRows:
    """The ledger's quota configuration as its rows' JSON: what an import is compared with."""

    cohorts: list[str]
    flavors: dict[str, dict[str, Any]]
    tenants: dict[str, dict[str, Any]]
    quotas: dict[tuple[str, str], dict[str, Any]]
    parents: dict[str, str | None] | None = None  # per cohort (None: every cohort a top one)
    cohort_quotas: dict[tuple[str, str], dict[str, Any]] | None = None  # per (cohort, flavor)
    half_life: float = 0.0


async def read_quota_rows(session: AsyncSession) -> QuotaRows:
    """Plain rows, no ORM objects: an import of 100,000 tenants reads them all."""
    parents = {name: parent for name, parent in await session.execute(select(Cohort.name, Cohort.parent))}
    return QuotaRows(
        list(parents),
        {row.name: flavor_json(row) for row in await session.execute(
            select(*(FlavorRow.__table__.c[c] for c in FLAVOR_COLUMNS.values())))},
        {row.name: tenant_json(row) for row in await session.execute(
            select(*(Tenant.__table__.c[c] for c in TENANT_COLUMNS.values())))},
        {(row.tenant, row.flavor): quota_json(row) for row in await session.execute(
            select(*(Quota.__table__.c[c] for c in QUOTA_COLUMNS.values())))},
        parents,
        {(row.cohort, row.flavor): cohort_quota_json(row) for row in await session.execute(
            select(*(CohortQuotaRow.__table__.c[c] for c in COHORT_QUOTA_COLUMNS.values())))},
        await half_life(session))


def quota_changes(config: QuotaConfig, rows: QuotaRows) -> list[Change]:
    """What makes the ledger's rows equal `config`, in the order an import makes them: the half-life,
    cohorts and flavors created first (a cohort's parent set once every cohort exists), each cohort's and
    each tenant's quotas, deletions of what tenants referred to last. Pure, and linear in the rows: a
    tenant's existing quotas are looked up by tenant, not searched."""
    flavors, tenants, quotas = rows.flavors, rows.tenants, rows.quotas
    parents = rows.parents if rows.parents is not None else {name: None for name in rows.cohorts}
    changes: list[Change] = []

    def note(change: Change | None) -> None:
        if change is not None:
            changes.append(change)

    if float(config.half_life) != float(rows.half_life):
        changes.append(Change("fair-sharing", FAIR_SHARING_ENTITY, "update", fair_sharing_json(rows.half_life),
                              fair_sharing_json(config.half_life)))
    existing_cohorts = set(rows.cohorts)
    for name in config.cohorts:
        before = cohort_json(name, parents.get(name)) if name in existing_cohorts else None
        note(_diff("cohort", f"cohort/{name}", before, cohort_json(name, config.cohort(name).parent)))
    held_cohort_quotas: dict[str, dict[str, dict[str, Any]]] = {}
    for (cohort, flavor_name), row in (rows.cohort_quotas or {}).items():
        held_cohort_quotas.setdefault(cohort, {})[flavor_name] = row
    for name in config.cohorts:
        own = config.cohort(name).quotas
        held = held_cohort_quotas.get(name, {})
        for flavor_name in sorted(own):
            note(_diff("cohort-quota", f"cohort-quota/{name}/{flavor_name}", held.get(flavor_name),
                       _wanted_cohort_quota(name, flavor_name, own[flavor_name])))
        for flavor_name in sorted(set(held) - set(own)):
            note(_diff("cohort-quota", f"cohort-quota/{name}/{flavor_name}", held[flavor_name], None))
    wanted_cohorts = set(config.cohorts)
    for cohort, flavor_name in sorted(rows.cohort_quotas or {}):
        if cohort not in wanted_cohorts:
            note(_diff("cohort-quota", f"cohort-quota/{cohort}/{flavor_name}",
                       (rows.cohort_quotas or {})[(cohort, flavor_name)], None))
    wanted_flavors = {f.name for f in config.listed_flavors}
    for position, flavor in enumerate(config.listed_flavors):
        after = {"name": flavor.name, "selector": flavor.selector, "value": float(flavor.value), "position": position}
        note(_diff("flavor", f"flavor/{flavor.name}", flavors.get(flavor.name), after))
    for gone in sorted(set(flavors) - wanted_flavors):
        note(_diff("flavor", f"flavor/{gone}", flavors[gone], None))

    by_tenant: dict[str, dict[str, dict[str, Any]]] = {}
    for (tenant, flavor_name), row in quotas.items():
        by_tenant.setdefault(tenant, {})[flavor_name] = row
    for name in sorted(config.tenants):
        wanted = config.tenants[name]
        note(_diff("tenant", f"tenant/{name}", tenants.get(name), _wanted_tenant(wanted)))
        held = by_tenant.get(name, {})
        for flavor_name in sorted(wanted.quotas):
            note(_diff("quota", f"quota/{name}/{flavor_name}", held.get(flavor_name),
                       _wanted_quota(name, flavor_name, wanted.quotas[flavor_name])))
        for flavor_name in sorted(set(held) - set(wanted.quotas)):
            note(_diff("quota", f"quota/{name}/{flavor_name}", held[flavor_name], None))
    for tenant, flavor_name in sorted(quotas):
        if tenant not in config.tenants:
            note(_diff("quota", f"quota/{tenant}/{flavor_name}", quotas[(tenant, flavor_name)], None))
    for name in sorted(set(tenants) - set(config.tenants)):
        note(_diff("tenant", f"tenant/{name}", tenants[name], None))
    def depth(name: str) -> int:
        seen = {name}
        while (parent := parents.get(name)) is not None and parent not in seen:
            seen.add(parent)
            name = parent
        return len(seen)

    # nested cohorts before their parents: no statement deletes a parent whose child is still there
    for name in sorted(existing_cohorts - set(config.cohorts), key=lambda n: (-depth(n), n)):
        note(_diff("cohort", f"cohort/{name}", cohort_json(name, parents.get(name)), None))
    return changes


def _wanted_cohort_quota(cohort: str, flavor: str, limit: QuotaLimit) -> dict[str, Any]:
    return {"cohort": cohort, "flavor": flavor, "nominal": limit.nominal, "borrowingLimit": limit.borrowing_limit,
            "lendingLimit": limit.lending_limit}


async def plan_quota_config(session: AsyncSession, config: QuotaConfig) -> list[Change]:
    """What `apply_quota_config` would change, written nowhere."""
    return quota_changes(config, await read_quota_rows(session))


def _columns(values: Mapping[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    return {column: values[key] for key, column in columns.items()}


_CHUNK = 500  # names per IN list: well inside SQLite's and PostgreSQL's limits on bound parameters


def _chunks(items: list[Any]) -> Iterable[list[Any]]:
    return (items[i:i + _CHUNK] for i in range(0, len(items), _CHUNK))


async def write_quota_changes(session: AsyncSession, changes: list[Change], actor: str) -> None:
    """Write a plan of `quota_changes` and its audit rows, in the order foreign keys need: cohorts, flavors,
    tenants, quotas, then the deletions of quotas, tenants and cohorts. One statement per kind of change
    (executemany), not a flush per row: 100,000 tenants took minutes that way."""
    of: dict[tuple[str, str], list[Change]] = {}
    for change in changes:
        of.setdefault((change.kind, change.action), []).append(change)

    def rows(kind: str, action: str, columns: Mapping[str, str]) -> list[dict[str, Any]]:
        return [_columns(c.after or {}, columns) for c in of.get((kind, action), [])]

    async def many(statement: Any, values: list[dict[str, Any]]) -> None:
        if values:
            await session.execute(statement, values)

    for change in of.get(("fair-sharing", "update"), []):
        await set_half_life(session, float((change.after or {})["halfLife"]))
    # cohorts first without parents, then the parents, once every cohort a parent names exists
    await many(insert(Cohort), [{"name": (c.after or {})["name"]} for c in of.get(("cohort", "create"), [])])
    await many(update(Cohort), [row for row in rows("cohort", "create", COHORT_COLUMNS) if row["parent"] is not None]
               + rows("cohort", "update", COHORT_COLUMNS))
    await many(insert(FlavorRow), rows("flavor", "create", FLAVOR_COLUMNS))
    await many(update(FlavorRow), rows("flavor", "update", FLAVOR_COLUMNS))
    await many(insert(Tenant), rows("tenant", "create", TENANT_COLUMNS))
    await many(update(Tenant), rows("tenant", "update", TENANT_COLUMNS))
    gone_quotas = [((c.before or {})["tenant"], (c.before or {})["flavor"]) for c in of.get(("quota", "delete"), [])]
    for pairs in _chunks(gone_quotas):
        await session.execute(delete(Quota).where(tuple_(Quota.tenant, Quota.flavor).in_(pairs)))
    await many(insert(Quota), rows("quota", "create", QUOTA_COLUMNS))
    await many(update(Quota), rows("quota", "update", QUOTA_COLUMNS))
    gone_cohort_quotas = [((c.before or {})["cohort"], (c.before or {})["flavor"])
                          for c in of.get(("cohort-quota", "delete"), [])]
    for pairs in _chunks(gone_cohort_quotas):
        await session.execute(delete(CohortQuotaRow).where(
            tuple_(CohortQuotaRow.cohort, CohortQuotaRow.flavor).in_(pairs)))
    await many(insert(CohortQuotaRow), rows("cohort-quota", "create", COHORT_QUOTA_COLUMNS))
    await many(update(CohortQuotaRow), rows("cohort-quota", "update", COHORT_QUOTA_COLUMNS))
    for kind, model in (("flavor", FlavorRow), ("tenant", Tenant), ("cohort", Cohort)):
        names = [(c.before or {})["name"] for c in of.get((kind, "delete"), [])]
        for chunk in _chunks(names):
            await session.execute(delete(model).where(model.name.in_(chunk)))
    await many(insert(AuditEntry), [
        {"actor": actor, "action": "delete" if c.action == "delete" else "put", "entity": c.entity,
         "before": c.before, "after": c.after} for c in changes])


async def lock_configuration(session: AsyncSession) -> None:
    """Writers of the quota configuration take turns (the config_revision row locked until the transaction
    ends): two cohort edits checked for cycles at once under READ COMMITTED could each pass and together
    make one. SQLite's writers take turns already."""
    await session.execute(select(ConfigRevision.id).where(ConfigRevision.id == 1).with_for_update())


async def apply_quota_config(session: AsyncSession, config: QuotaConfig, actor: str) -> list[Change]:
    """Make the ledger hold exactly `config`: rows it does not name (flavors, cohorts, tenants, quotas)
    are deleted. Runs inside the caller's transaction; returns the changes in the order they were made
    (cohorts and flavors created first, deletions of what tenants referred to last)."""
    await lock_configuration(session)
    changes = await plan_quota_config(session, config)
    await write_quota_changes(session, changes, actor)
    return changes
