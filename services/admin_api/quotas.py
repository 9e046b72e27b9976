"""The Quotas document as a whole (export, import with a dry run) and usage per tenant and flavor.

An import is planned and written in one transaction; a dry run is that plan, written nowhere, so what it
reports is exactly what the import would do. Imports and exports grow with the document and the ledger:
they run in a worker process beside the allocator (services/admin_api/offload.py), past the limits on
tenants and quotas an import is refused with the numbers.
"""

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Annotated, Any, Literal

import orjson
import yaml
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import Field

from services.admin_api.access import Caller, Session, admin
from services.admin_api.fields import INT32_MAX, Model
from services.admin_api.offload import Answer, Limits, Reach, ledger, workers
from services.admin_api.problems import PROBLEMS, Problem, problem_doc
from shared.admission.past_use import halves_in, per_tenant
from shared.admission.quota import QuotaConfig, QuotaFileError, parse_quotas
from shared.dra import model as dra
from shared.dra.cel import SelectorError, compile_selector
from shared.ledger.handles import AsyncSession
from shared.ledger.holdings import devices_by_claim_and_flavor, use_by_tenant_and_flavor
from shared.ledger.past_use import past_use_now
from shared.ledger.pending import pending_documents
from shared.ledger.quota_store import apply_quota_config, load_quota_config, quota_changes, read_quota_rows

router = APIRouter(tags=["quotas"], responses=PROBLEMS)
YAML = "application/yaml"
_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's where installed: several times faster
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ChangeOut(Model):
    kind: str = Field(description="cohort | flavor | tenant | quota | cohort-quota | fair-sharing")
    entity: str = Field(description="as in the audit log, e.g. quota/vision/H100, cohort-quota/research/H100, "
                                    "fair-sharing")
    action: str = Field(description="create | update | delete")
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class HolderOut(Model):
    namespace: str
    name: str
    devices: int = Field(description="devices of the flavor this claim holds")


class ExceedingOut(Model):
    """A tenant that holds more devices of a flavor than its new nominal quota plus borrowing limit."""

    tenant: str
    flavor: str
    used: int
    nominal: int
    borrowing_limit: int
    claims: list[HolderOut]


class ImportOut(Model):
    dry_run: bool
    changes: list[ChangeOut]
    exceeding: list[ExceedingOut] = Field(description="running claims over their new quota")


class UsageRow(Model):
    tenant: str
    cohort: str | None
    flavor: str | None = Field(description="null: devices no flavor's selector accepts")
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    used: int = Field(description="allocated devices")
    used_units: float = Field(description="their GPU units")
    borrowed: int = Field(description="devices in use beyond the nominal quota")
    lent: int = Field(description="unused nominal quota that others in the cohort use")
    pending: int = Field(default=0, description="devices Pending claims ask for, counted against the cheapest "
                                                "flavor their requests accept (from the allocator's explain)")
    pending_units: float = Field(default=0.0, description="those devices in GPU units")


class PendingDemand(Model):
    tenant: str
    claims: int = Field(description="Pending claims")
    devices: int = Field(description="devices they request (count per request, 1 for allocationMode All)")
    units: float = Field(default=0.0, description="those devices in GPU units, at the cheapest flavor each "
                                                  "claim's requests accept (0 until the allocator explained it)")


class ShareOut(Model):
    """A tenant's place in fair share: what it holds and, with fairSharing.halfLife, what it held before."""

    tenant: str
    weight: float
    in_use: float = Field(description="GPU units it holds now")
    past_use: float = Field(description="GPU units it held, averaged over time with the half-life (0 without one)")
    share: float = Field(description="(inUse + pastUse) / weight: fair share orders tenants by it, lowest first")
    halves_in: float | None = Field(description="seconds until its past use is half of what it is now, if it "
                                                "keeps holding what it holds; null: it never does, or it has none")


class CohortFlavorOut(Model):
    flavor: str
    used: int = Field(description="devices the cohort's subtree (its tenants and nested cohorts') holds")
    nominal: int = Field(description="the subtree's nominal quota: the cohort's own, its tenants' and nested "
                                     "cohorts' nominal quotas")
    own_nominal: int = Field(description="the cohort's own nominal quota")
    borrowing_limit: int | None = Field(description="what the subtree may borrow from its parent; null: no limit")
    lending_limit: int | None = Field(description="what the subtree lends its parent; null: its unused nominal")


class CohortUsageOut(Model):
    name: str
    parent: str | None
    depth: int = Field(description="0 for a top cohort, 1 for one nested in it, ...")
    flavors: list[CohortFlavorOut]


class UsageOut(Model):
    enforced: bool = Field(description="false while no quota exists: the fleet is open")
    items: list[UsageRow]
    pending: list[PendingDemand]
    half_life: float = Field(default=0.0, description="fairSharing.halfLife in seconds; 0: shares count only "
                                                      "what runs now")
    shares: list[ShareOut] = Field(default_factory=list, description="per tenant, by share, lowest first")
    cohorts: list[CohortUsageOut] = Field(default_factory=list, description=(
        "the cohort tree, parents before their children: used / nominal per level and flavor"))


def _count(request: Any) -> int:
    if not isinstance(request, dict):
        return 0
    if request.get("allocationMode") == "All":
        return 1
    count = request.get("count", 1)
    return count if isinstance(count, int) and count > 0 else 1


def requested_devices(document: Any) -> int:
    """Devices a stored claim asks for: `exactly` (v1) or the request itself (v1beta1), or the first of
    `firstAvailable`, which is what the allocator tries first."""
    spec = document.get("spec", document) if isinstance(document, dict) else {}
    requests = ((spec or {}).get("devices") or {}).get("requests") or [] if isinstance(spec, dict) else []
    total = 0
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            total += _count(request["exactly"])
        elif isinstance(request.get("firstAvailable"), list) and request["firstAvailable"]:
            total += _count(request["firstAvailable"][0])
        else:
            total += _count(request)
    return total


def _visible(rows: Iterable[Any], tenant: str | None) -> list[Any]:
    return [r for r in rows if tenant is None or r.tenant == tenant]


@router.get("/v1/usage", response_model=UsageOut)
async def usage(s: Session, token: Caller) -> UsageOut:
    """Per tenant and flavor. `lent`, per cohort and flavor: a tenant's unused nominal quota (at most its
    lendingLimit) that the others' borrowing uses, min(unused, borrowed by the others)."""
    config = await load_quota_config(s)
    used = await use_by_tenant_and_flavor(s)
    pending: dict[str, list[float]] = {}
    values = {f.name: f.value for f in config.flavors}
    wanted: dict[tuple[str, str | None], list[float]] = {}
    for ns, spec, explain in await pending_documents(s):
        devices = requested_devices(spec)
        accepted = [f for f in (explain or {}).get("flavors") or [] if f in values]
        flavor = min(accepted, key=lambda f: (values[f], f)) if accepted else None
        units = devices * values[flavor] if flavor is not None else 0.0
        entry = pending.setdefault(ns, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += devices
        entry[2] += units
        if flavor is not None:
            demand_row = wanted.setdefault((ns, flavor), [0, 0.0])
            demand_row[0] += devices
            demand_row[1] += units
    pairs = {(t.name, f) for t in config.tenants.values() for f in t.quotas} | set(used) | set(wanted)
    rows = []
    for tenant_name, flavor in sorted(pairs, key=lambda p: (p[0], p[1] or "")):
        tenant = config.tenant(tenant_name)
        limit = tenant.limit(flavor) if flavor is not None else None
        nominal = limit.nominal if limit else 0
        n, units = used.get((tenant_name, flavor), (0, 0.0))
        rows.append(UsageRow(tenant=tenant_name, cohort=tenant.cohort, flavor=flavor, nominal=nominal,
                             borrowing_limit=limit.borrowing_limit if limit else None,
                             lending_limit=limit.lending_limit if limit else None, used=n,
                             used_units=round(units, 4), borrowed=max(0, n - nominal), lent=0,
                             pending=int(wanted.get((tenant_name, flavor), (0, 0.0))[0]),
                             pending_units=round(wanted.get((tenant_name, flavor), (0, 0.0))[1], 4)))
    for row in rows:
        if row.cohort is None or row.flavor is None:
            continue
        others = sum(o.borrowed for o in rows
                     if o.cohort == row.cohort and o.flavor == row.flavor and o.tenant != row.tenant)
        lendable = max(0, row.nominal - row.used)
        if row.lending_limit is not None:
            lendable = min(lendable, row.lending_limit)
        row.lent = min(lendable, others)
    demand = [PendingDemand(tenant=t, claims=int(c), devices=int(d), units=round(u, 4))
              for t, (c, d, u) in sorted(pending.items())]
    past = await past_use_now(s, time.time(), config.half_life) if config.half_life > 0 else {}
    shares = tenant_shares(config, used, past)
    tree = cohort_usage(config, used)
    if token.tenant is not None:
        mine = config.ancestors(home) if (home := config.tenant(token.tenant).cohort) is not None else []
        tree = [c for c in tree if c.name in mine]
    return UsageOut(enforced=config.enforced, items=_visible(rows, token.tenant),
                    pending=_visible(demand, token.tenant), half_life=config.half_life,
                    shares=_visible(shares, token.tenant), cohorts=tree)


def tenant_shares(config: QuotaConfig, used: Mapping[tuple[str, str | None], tuple[int, float]],
                  past: Mapping[tuple[str, str], float]) -> list[ShareOut]:
    """Every tenant known or holding, by share (lowest first: the next in fair share), then name."""
    in_use: dict[str, float] = {}
    for (tenant, flavor), (_, units) in used.items():
        if flavor is not None:
            in_use[tenant] = in_use.get(tenant, 0.0) + units
    past_by_tenant = per_tenant(past)
    out = []
    for name in sorted(set(config.tenants) | set(in_use) | set(past_by_tenant)):
        weight = config.tenant(name).weight
        held, before = in_use.get(name, 0.0), past_by_tenant.get(name, 0.0)
        halving = halves_in(before, held, config.half_life)
        out.append(ShareOut(tenant=name, weight=weight, in_use=round(held, 4), past_use=round(before, 4),
                            share=round((held + before) / weight, 4),
                            halves_in=round(halving, 1) if halving is not None else None))
    return sorted(out, key=lambda share: (share.share, share.tenant))


def cohort_usage(config: QuotaConfig, used: Mapping[tuple[str, str | None], tuple[int, float]]) -> list[CohortUsageOut]:
    """Per cohort and flavor: devices its subtree holds against the subtree's nominal quota, parents first."""
    subtree_used: dict[str, dict[str, int]] = {}
    subtree_nominal: dict[str, dict[str, int]] = {}

    def add(to: dict[str, dict[str, int]], cohort: str, flavor: str, amount: int) -> None:
        for at in config.ancestors(cohort):
            per_flavor = to.setdefault(at, {})
            per_flavor[flavor] = per_flavor.get(flavor, 0) + amount

    for (tenant, flavor), (devices, _) in used.items():
        if flavor is not None and (home := config.tenant(tenant).cohort) is not None:
            add(subtree_used, home, flavor, devices)
    for member in config.tenants.values():
        if member.cohort is not None:
            for flavor, limit in member.quotas.items():
                add(subtree_nominal, member.cohort, flavor, limit.nominal)
    for name in config.cohorts:
        for flavor, limit in config.cohort(name).quotas.items():
            add(subtree_nominal, name, flavor, limit.nominal)
    children: dict[str | None, list[str]] = {}
    for name in config.cohorts:
        children.setdefault(config.cohort(name).parent, []).append(name)
    out: list[CohortUsageOut] = []
    to_visit = [(top, 0) for top in sorted(children.get(None, []), reverse=True)]
    while to_visit:  # depth first, parents before children, without recursion (a tree may be deep)
        name, depth = to_visit.pop()
        node = config.cohort(name)
        held, nominal = subtree_used.get(name, {}), subtree_nominal.get(name, {})
        rows = []
        for flavor in sorted(set(held) | set(nominal)):
            own = node.limit(flavor)
            rows.append(CohortFlavorOut(flavor=flavor, used=held.get(flavor, 0), nominal=nominal.get(flavor, 0),
                                        own_nominal=own.nominal if own else 0,
                                        borrowing_limit=own.borrowing_limit if own else None,
                                        lending_limit=own.lending_limit if own else None))
        out.append(CohortUsageOut(name=name, parent=node.parent, depth=depth, flavors=rows))
        to_visit.extend((child, depth + 1) for child in sorted(children.get(name, []), reverse=True))
    return out


@router.get("/v1/quotas/export", responses={200: {"content": {YAML: {}, "application/json": {}},
                                                  "description": "the contract's Quotas document"},
                                             503: problem_doc("the work did not finish in time or waited behind "
                                                              "others (Retry-After)")})
async def export_quotas(request: Request, token: Caller,
                        format: Annotated[Literal["yaml", "json"], Query()] = "yaml") -> Response:
    """The contract's Quotas YAML (or JSON); importing it gives back the same configuration. A scoped
    viewer gets its own tenant only."""
    return await workers(request).run(request, "quota export", export_job, token.tenant, format)


async def export_job(reach: Reach, _: Limits, tenant: str | None, format: str) -> Answer:
    """In a worker: a YAML document of 10,000 tenants took 1.7 s to write."""
    async with ledger(reach) as factory, factory() as s:
        config = await load_quota_config(s)
    if tenant is not None:  # its own tenant, and the cohorts above it with their quotas
        home = config.tenant(tenant).cohort
        above = set(config.ancestors(home)) if home is not None and tenant in config.tenants else set()
        config = replace(config, tenants={k: v for k, v in config.tenants.items() if k == tenant},
                         cohorts=tuple(c for c in config.cohorts if c in above),
                         cohort_tree={k: v for k, v in config.cohort_tree.items() if k in above})
    document = config.to_document()
    if format == "json":
        return Answer(200, orjson.dumps(document))
    return Answer(200, yaml.dump(document, Dumper=_DUMPER, sort_keys=False).encode(), YAML)


_IMPORT_BODY = {"requestBody": {"required": True, "content": {
    YAML: {"schema": {"type": "string", "description": "a Quotas document"}},
    "application/json": {"schema": {"type": "object", "description": "a Quotas document"}}}}}


def _unstorable(document: Any, config: QuotaConfig) -> str | None:
    """What the ledger could not hold, by field: tenant and cohort names that are not DNS labels (a tenant
    is a namespace), names over their columns, numbers over 32-bit INTEGER columns, floats that are not
    finite (YAML's .inf)."""
    for i, listed_flavor in enumerate(config.listed_flavors):
        if len(listed_flavor.name) > 253:
            return f"flavors[{i}].name: at most 253 characters"
        if not math.isfinite(listed_flavor.value):
            return f"flavors[{i}].value: must be a finite number"
    listed = (document.get("cohorts") or []) if isinstance(document, dict) else []
    for i, cohort in enumerate(config.cohorts[:len(listed)]):
        if not dra.is_dns_label(cohort):
            return f"cohorts[{i}].name: {dra.shown(cohort)} {dra.DNS_LABEL_RULE}"
        for flavor, limit in config.cohort(cohort).quotas.items():
            for field_name, amount in (("nominal", limit.nominal), ("borrowingLimit", limit.borrowing_limit),
                                       ("lendingLimit", limit.lending_limit)):
                if amount is not None and amount > INT32_MAX:
                    return f"cohorts[{i}].quotas.{flavor}.{field_name}: {amount} is over the limit of {INT32_MAX}"
    if not math.isfinite(config.half_life):
        return "fairSharing.halfLife: must be a finite duration"
    for i, tenant in enumerate(config.tenants.values()):
        at = f"tenants[{i}]"
        if not dra.is_dns_label(tenant.name):
            return f"{at}.name: {dra.shown(tenant.name)} {dra.DNS_LABEL_RULE}"
        if tenant.cohort is not None and not dra.is_dns_label(tenant.cohort):
            return f"{at}.cohort: {dra.shown(tenant.cohort)} {dra.DNS_LABEL_RULE}"
        for number, value in (("weight", tenant.weight), ("pendingAlertAfter", tenant.pending_alert_after),
                              ("gangReserveAfter", tenant.gang_reserve_after)):
            if value is not None and not math.isfinite(value):
                return f"{at}.{number}: must be a finite number"
        for flavor, limit in tenant.quotas.items():
            for field_name, amount in (("nominal", limit.nominal), ("borrowingLimit", limit.borrowing_limit),
                                       ("lendingLimit", limit.lending_limit)):
                if amount is not None and amount > INT32_MAX:
                    return f"{at}.quotas.{flavor}.{field_name}: {amount} is over the limit of {INT32_MAX}"
    return None


def _read(body: bytes) -> Any:
    """JSON when the body is JSON (a hundred times faster to read than as YAML), else YAML."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return yaml.load(body.decode("utf-8"), Loader=_LOADER)
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as error:
        raise Problem(422, "invalid Quotas document", f"cannot read the body as YAML or JSON: {error}") from None


def parse_import(body: bytes, limits: Limits) -> QuotaConfig:
    """The body of an import as the configuration it names: 422 naming the field, or the size and its limit."""
    document = _read(body)
    if problems := dra.text_problems(document):
        raise Problem(422, "invalid Quotas document", f"Quotas: {problems[0]}")
    try:
        config = parse_quotas(document)
    except QuotaFileError as error:
        raise Problem(422, "invalid Quotas document", str(error)) from None
    quotas = sum(len(t.quotas) for t in config.tenants.values())
    for what, count, limit, setting in (("tenants", len(config.tenants), limits.import_max_tenants, "TENANTS"),
                                        ("quotas", quotas, limits.import_max_quotas, "QUOTAS")):
        if count > limit:
            raise Problem(422, "Quotas document too large", (
                f"Quotas: {count:,} {what}, over the limit of {limit:,} (CLAIMBROKER_QUOTA_IMPORT_MAX_{setting}); "
                "raise it on the broker to import more"))
    if (problem := _unstorable(document, config)) is not None:
        raise Problem(422, "invalid Quotas document", f"Quotas: {problem}")
    for i, flavor in enumerate(config.listed_flavors):
        try:
            compile_selector(flavor.selector)
        except SelectorError as error:
            raise Problem(422, "invalid selector", f"Quotas: flavors[{i}] {flavor.name}: selector: {error}") from None
    return config


async def exceeding(s: AsyncSession, config: QuotaConfig) -> list[ExceedingOut]:
    """Tenants holding more devices of a flavor than nominal + borrowingLimit (an unset borrowingLimit
    has no cap), with the claims that hold them."""
    holders: dict[tuple[str, str], list[HolderOut]] = {}
    for ns, name, flavor, n in await devices_by_claim_and_flavor(s):
        holders.setdefault((ns, flavor), []).append(HolderOut(namespace=ns, name=name, devices=n))
    out = []
    for (tenant, flavor), claims in holders.items():
        limit = config.tenant(tenant).limit(flavor)
        if limit is None or limit.borrowing_limit is None:
            continue
        total = sum(c.devices for c in claims)
        if total > limit.nominal + limit.borrowing_limit:
            out.append(ExceedingOut(tenant=tenant, flavor=flavor, used=total, nominal=limit.nominal,
                                    borrowing_limit=limit.borrowing_limit, claims=claims))
    return out


@router.post("/v1/quotas/import", response_model=ImportOut, openapi_extra=_IMPORT_BODY, responses={
    413: problem_doc("the body is over CLAIMBROKER_ADMIN_MAX_BODY"),
    422: problem_doc("the document is invalid, or has more tenants or quotas than the limits allow; the detail "
                     "names the field, or the number and the limit"),
    503: problem_doc("the work did not finish in time, ran out of memory or waited behind others (Retry-After)")})
async def import_quotas(request: Request, token: Caller,
                        dry_run: Annotated[bool, Query(alias="dryRun")] = False) -> Response:
    """Make the ledger hold exactly this Quotas document: flavors, cohorts, tenants and quotas it does
    not name are deleted. With dryRun=true nothing is written; the answer is the same."""
    admin(token)
    return await workers(request).run(request, "quota import", import_job, await request.body(), dry_run,
                                      token.actor)


async def import_job(reach: Reach, limits: Limits, body: bytes, dry_run: bool, actor: str) -> Answer:
    """In a worker: the document read and checked, then planned (a dry run) or planned and written in one
    transaction, with the claims over their new quota."""
    config = parse_import(body, limits)
    async with ledger(reach) as factory, factory() as s, s.begin():
        if dry_run:  # the rows only: the transaction (on SQLite the ledger's write lock) ends before the plan
            rows = await read_quota_rows(s)
        else:
            changes = await apply_quota_config(s, config, actor)
        over = await exceeding(s, config)
    if dry_run:
        changes = quota_changes(config, rows)
    result = ImportOut(dry_run=dry_run, changes=[ChangeOut(**c.to_json()) for c in changes], exceeding=over)
    return Answer(200, result.model_dump_json(by_alias=True).encode())
