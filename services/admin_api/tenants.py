"""Tenants, cohorts, flavors and quotas: the rows the allocator reads at each decision cycle.

Every write is audited in its own transaction; a quota refers to a known flavor and lends at most its
nominal quota, the same rules an imported Quotas file must follow.
"""

from typing import Annotated

from fastapi import APIRouter, Body, HTTPException
from pydantic import Field

from services.admin_api.access import Caller, Session, admin, audit, visible
from services.admin_api.fields import INT32_MAX, DnsLabel, Input, LabelName, Model, Name, dump
from services.admin_api.problems import PROBLEMS, Problem, problem_doc
from shared.admission.quota import BUILTIN_FLAVORS, QuotaLimit
from shared.dra.cel import SelectorError, compile_selector
from shared.ledger import flavors, quotas, tenants
from shared.ledger.handles import AsyncSession
from shared.ledger.quota_store import (
    FAIR_SHARING_ENTITY,
    fair_sharing_json,
    flavor_json,
    half_life,
    load_quota_config,
    lock_configuration,
    quota_json,
    set_half_life,
    tenant_json,
)
from shared.ledger.schema import Tenant
from shared.ledger.tenants import TenantSettings

router = APIRouter(responses=PROBLEMS)
MAX_SECONDS = 10 * 365 * 86400.0  # ten years
BUILTIN = {f.name: f for f in BUILTIN_FLAVORS}


class TenantIn(Input):
    cohort: DnsLabel | None = Field(default=None, description="a DNS label, as tenant names are")
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    pending_alert_after: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="seconds")
    admin_access: bool = Field(default=False, description=(
        "may submit adminAccess requests (monitoring access to devices in use), as Kubernetes allows only in "
        "namespaces labelled resource.kubernetes.io/admin-access"))
    max_pending: int | None = Field(default=None, ge=0, le=INT32_MAX, description=(
        "waiting claims the tenant may hold; a claim past it is Rejected with the number; none: no limit"))
    min_runtime: float | None = Field(default=None, ge=0, le=MAX_SECONDS, allow_inf_nan=False, description=(
        "seconds after their allocation before the tenant's claims may be preempted for fair share or reclaim; "
        "none: the broker's default"))
    max_preemptions_per_minute: int | None = Field(default=None, ge=0, le=INT32_MAX, description=(
        "the tenant's claims preempted for fair share or reclaim a minute at most; none: no limit"))
    gang_reserve_after: float | None = Field(default=None, ge=0, le=MAX_SECONDS, allow_inf_nan=False, description=(
        "seconds: a gang of the tenant's claims first in its fair-share order this long keeps the devices it needs "
        "as they free; 0: never; none: the broker's default (CLAIMBROKER_GANG_RESERVE_AFTER)"))


class TenantOut(Model):
    name: str
    cohort: str | None
    weight: float
    pending_alert_after: float | None = Field(description="seconds")
    admin_access: bool
    max_pending: int | None
    min_runtime: float | None = Field(description="seconds")
    max_preemptions_per_minute: int | None
    gang_reserve_after: float | None = Field(description="seconds")


class QuotaIn(Input):
    nominal: int = Field(default=0, ge=0, le=INT32_MAX)
    borrowing_limit: int | None = Field(default=None, ge=0, le=INT32_MAX)
    lending_limit: int | None = Field(default=None, ge=0, le=INT32_MAX)


class QuotaOut(Model):
    tenant: str
    flavor: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None


class CohortQuotaIn(Input):
    nominal: int = Field(default=0, ge=0, le=INT32_MAX)
    borrowing_limit: int | None = Field(default=None, ge=0, le=INT32_MAX, description=(
        "what the cohort's subtree may borrow from its parent (or the free capacity); none: no limit"))
    lending_limit: int | None = Field(default=None, ge=0, le=INT32_MAX, description=(
        "what the subtree lends its parent of its unused nominal quota; none: all of it"))


class CohortQuotaOut(Model):
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None


class CohortIn(Input):
    """Optional fields; the body itself is optional. A field left out keeps what the cohort has (nothing, for a
    new cohort); a field given replaces it (`parent: null` makes it a top cohort, `quotas: {}` drops its own)."""

    parent: DnsLabel | None = Field(default=None, description=(
        "the cohort it nests in; none: a top cohort. It must exist, and a cohort may not be its own ancestor"))
    quotas: dict[str, CohortQuotaIn] | None = Field(default=None, description=(
        "the cohort's own quota per flavor, shared by its subtree"))


class CohortOut(Model):
    name: str
    parent: str | None = Field(default=None, description="the cohort it nests in; null: a top cohort")
    quotas: dict[str, CohortQuotaOut] = Field(default_factory=dict, description="its own quota per flavor")
    tenants: list[str] = Field(description="tenants in this cohort")


class FairSharingIn(Input):
    half_life: float = Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False, description=(
        "seconds: shares count past use halving every halfLife (the Quotas file's fairSharing.halfLife); "
        "0: only what runs now"))


class FairSharingOut(Model):
    half_life: float = Field(description="seconds; 0: past use is off, shares count only what runs now")


class FlavorIn(Input):
    selector: str = Field(min_length=1, description="CEL over `device`, as in DRA selectors")
    value: float = Field(default=1.0, ge=0, allow_inf_nan=False,
                         description="GPU units one device of this flavor weighs")
    position: int | None = Field(default=None, ge=0, le=INT32_MAX,
                                 description="place among the custom flavors (default: last, or unchanged)")


class FlavorOut(Model):
    name: str
    selector: str
    value: float
    built_in: bool = Field(description="a built-in flavor not redefined in the ledger")
    position: int | None = Field(description="place among the custom flavors; null for a built-in")


def tenant_out(row: Tenant) -> TenantOut:
    return TenantOut(name=row.name, cohort=row.cohort, weight=row.weight, pending_alert_after=row.pending_alert_after_s,
                     admin_access=bool(row.admin_access), max_pending=row.max_pending,
                     min_runtime=row.min_runtime_s, max_preemptions_per_minute=row.max_preemptions_per_minute,
                     gang_reserve_after=row.gang_reserve_after_s)


async def _tenant_or_404(s: AsyncSession, name: str) -> Tenant:
    row = await tenants.tenant(s, name)
    if row is None:
        raise HTTPException(404, f"tenant {name!r} not found")
    return row


# --- tenants ------------------------------------------------------------------------------------------


@router.get("/v1/tenants", response_model=list[TenantOut], tags=["tenants"])
async def list_tenants(s: Session, token: Caller) -> list[TenantOut]:
    return [tenant_out(t) for t in await tenants.tenants(s, token.tenant)]


@router.get("/v1/tenants/{name}", response_model=TenantOut, tags=["tenants"])
async def get_tenant(name: Name, s: Session, token: Caller) -> TenantOut:
    visible(token, name)
    return tenant_out(await _tenant_or_404(s, name))


@router.put("/v1/tenants/{name}", response_model=TenantOut, tags=["tenants"])
async def put_tenant(name: LabelName, body: TenantIn, s: Session, token: Caller) -> TenantOut:
    """Create or replace. The name is the tenant's namespace, so a DNS label. A cohort named for the first
    time is created here, in the same write (and audit row) as the tenant, so no separate step is needed."""
    admin(token)
    settings = TenantSettings(body.cohort, body.weight, body.pending_alert_after, body.admin_access, body.max_pending,
                              body.min_runtime, body.max_preemptions_per_minute, body.gang_reserve_after)
    async with s.begin():
        before, row = await tenants.put_tenant(s, name, settings)
        after = tenant_out(row)
        audit(s, token, "put", f"tenant/{name}", before, dump(after))
    return after


@router.delete("/v1/tenants/{name}", status_code=204, tags=["tenants"])
async def delete_tenant(name: Name, s: Session, token: Caller) -> None:
    """The tenant's quotas go with it, each audited, rather than vanishing by cascade unrecorded."""
    admin(token)
    async with s.begin():
        row = await _tenant_or_404(s, name)
        before = tenant_json(row)
        for quota in await tenants.delete_tenant(s, row):
            audit(s, token, "delete", f"quota/{name}/{quota['flavor']}", quota, None)
        audit(s, token, "delete", f"tenant/{name}", before, None)


# --- cohorts ------------------------------------------------------------------------------------------


def _cohort_out(name: str, parent: str | None, own: dict[str, QuotaLimit], members: list[str]) -> CohortOut:
    return CohortOut(name=name, parent=parent, tenants=members, quotas={
        flavor: CohortQuotaOut(nominal=limit.nominal, borrowing_limit=limit.borrowing_limit,
                               lending_limit=limit.lending_limit) for flavor, limit in sorted(own.items())})


@router.get("/v1/cohorts", response_model=list[CohortOut], tags=["cohorts"])
async def list_cohorts(s: Session, token: Caller) -> list[CohortOut]:
    """Every cohort with its parent and own quotas. A scoped viewer sees its own tenant's cohort only, with
    only its own tenant in it."""
    members: dict[str, list[str]] = {}
    for tenant, cohort in await tenants.tenant_cohorts(s):
        if cohort is not None and (token.tenant is None or tenant == token.tenant):
            members.setdefault(cohort, []).append(tenant)
    parents = await tenants.cohort_parents(s)
    own = await tenants.cohort_quotas(s)
    names = list(parents)
    if token.tenant is not None:
        names = [n for n in names if n in members]
    return [_cohort_out(n, parents[n], own.get(n, {}), members.get(n, [])) for n in names]


@router.get("/v1/cohorts/{name}", response_model=CohortOut, tags=["cohorts"])
async def get_cohort(name: Name, s: Session, token: Caller) -> CohortOut:
    parents = await tenants.cohort_parents(s)
    members = await tenants.members(s, name)
    if token.tenant is not None:
        members = [m for m in members if m == token.tenant]
    if name not in parents or (token.tenant is not None and not members):
        raise HTTPException(404, f"cohort {name!r} not found")
    return _cohort_out(name, parents[name], (await tenants.cohort_quotas(s, name)).get(name, {}), members)


@router.put("/v1/cohorts/{name}", response_model=CohortOut, tags=["cohorts"], responses={
    422: problem_doc("the parent is no cohort, or would make a cohort its own ancestor (the detail names the "
                     "cohorts); a quota names an unknown flavor or lends more than its nominal")})
async def put_cohort(name: LabelName, s: Session, token: Caller,
                     body: Annotated[CohortIn | None, Body()] = None) -> CohortOut:
    """Create or replace a cohort's parent and own quotas; fields left out keep what it has. Nothing is
    written when the parent is unknown or makes a cycle."""
    admin(token)
    given = body.model_fields_set if body is not None else set()
    own = None
    if body is not None and "quotas" in given:
        own = {flavor: QuotaLimit(q.nominal, q.borrowing_limit, q.lending_limit)
               for flavor, q in (body.quotas or {}).items()}
        for flavor, limit in own.items():
            if limit.lending_limit is not None and limit.lending_limit > limit.nominal:
                raise Problem(422, "invalid quota", f"quotas.{flavor}.lendingLimit: {limit.lending_limit} is more "
                                                    f"than the nominal quota {limit.nominal}")
    async with s.begin():
        await lock_configuration(s)  # another edit's parents are read after it committed, not before
        parents = await tenants.cohort_parents(s)
        existed = name in parents
        parent = body.parent if body is not None and "parent" in given else parents.get(name)
        if (problem := tenants.ancestry_problem(parents, name, parent)) is not None:
            raise Problem(422, "invalid cohort tree", problem)
        if own:
            config = await load_quota_config(s)
            unknown = sorted(flavor for flavor in own if config.flavor(flavor) is None)
            if unknown:
                known = ", ".join(f.name for f in config.flavors)
                raise Problem(422, "unknown flavor", f"quotas.{unknown[0]}: flavor {unknown[0]!r} is not defined; "
                                                     f"known flavors: {known}")
        held = (await tenants.cohort_quotas(s, name)).get(name, {}) if existed else {}
        before = tenants.cohort_state_json(name, parents.get(name), held) if existed else None
        await tenants.put_cohort(s, name, parent, own)
        after_own = own if own is not None else held
        after = tenants.cohort_state_json(name, parent, after_own)
        if after != before:
            audit(s, token, "put", f"cohort/{name}", before, after)
        members = await tenants.members(s, name)
    return _cohort_out(name, parent, after_own, members)


@router.delete("/v1/cohorts/{name}", status_code=204, tags=["cohorts"],
               responses={409: problem_doc("tenants or cohorts are still in the cohort")})
async def delete_cohort(name: Name, s: Session, token: Caller) -> None:
    """A cohort goes with its own quotas; one that tenants or other cohorts are in stays."""
    admin(token)
    async with s.begin():
        parents = await tenants.cohort_parents(s)
        if name not in parents:
            raise HTTPException(404, f"cohort {name!r} not found")
        users = await tenants.members(s, name)
        if users:
            raise Problem(409, "cohort in use", f"cohort {name!r} still has tenants: {', '.join(users)}; "
                                                "move them to another cohort first")
        nested = await tenants.children(s, name)
        if nested:
            raise Problem(409, "cohort in use", f"cohort {name!r} is the parent of cohorts: {', '.join(nested)}; "
                                                "give them another parent first")
        held = (await tenants.cohort_quotas(s, name)).get(name, {})
        audit(s, token, "delete", f"cohort/{name}", tenants.cohort_state_json(name, parents[name], held), None)
        await tenants.delete_cohort(s, name)


# --- fair sharing -------------------------------------------------------------------------------------


@router.get("/v1/fair-sharing", response_model=FairSharingOut, tags=["quotas"])
async def get_fair_sharing(s: Session, token: Caller) -> FairSharingOut:
    """The Quotas file's fairSharing: the half-life of past use in shares."""
    return FairSharingOut(half_life=await half_life(s))


@router.put("/v1/fair-sharing", response_model=FairSharingOut, tags=["quotas"])
async def put_fair_sharing(body: FairSharingIn, s: Session, token: Caller) -> FairSharingOut:
    """Set the half-life of past use; the allocator's next decision uses it. 0 turns past use off."""
    admin(token)
    async with s.begin():
        before = await set_half_life(s, body.half_life)
        if before != body.half_life:
            audit(s, token, "put", FAIR_SHARING_ENTITY, fair_sharing_json(before), fair_sharing_json(body.half_life))
    return FairSharingOut(half_life=body.half_life)


# --- flavors ------------------------------------------------------------------------------------------


@router.get("/v1/flavors", response_model=list[FlavorOut], tags=["flavors"])
async def list_flavors(s: Session, token: Caller) -> list[FlavorOut]:
    """In effective order: a device counts against the first flavor whose selector accepts it."""
    rows = await flavors.flavor_rows(s)
    config = await load_quota_config(s)
    return [FlavorOut(name=f.name, selector=f.selector, value=f.value, built_in=f.name not in rows,
                      position=rows[f.name].position if f.name in rows else None) for f in config.flavors]


@router.put("/v1/flavors/{name}", response_model=FlavorOut, tags=["flavors"],
            responses={422: problem_doc("the selector is not valid CEL; the detail is CEL's message")})
async def put_flavor(name: Name, body: FlavorIn, s: Session, token: Caller) -> FlavorOut:
    """Create or replace a custom flavor (a built-in's name overrides it). The selector is compiled
    here, so a typo is refused now rather than found by the allocator later."""
    admin(token)
    try:
        compile_selector(body.selector)
    except SelectorError as error:
        raise Problem(422, "invalid selector", f"selector: {error}") from None
    async with s.begin():
        before, row = await flavors.put_flavor(s, name, body.selector, body.value, body.position)
        audit(s, token, "put", f"flavor/{name}", before, flavor_json(row))
        out = FlavorOut(name=name, selector=row.selector, value=row.value, built_in=False, position=row.position)
    return out


@router.delete("/v1/flavors/{name}", status_code=204, tags=["flavors"],
               responses={409: problem_doc("a built-in flavor, or quotas still use it")})
async def delete_flavor(name: Name, s: Session, token: Caller) -> None:
    """Deleting a redefined built-in restores the built-in. A custom flavor that quotas use stays."""
    admin(token)
    async with s.begin():
        row = await flavors.flavor_row(s, name)
        if row is None:
            if name in BUILTIN:
                raise Problem(409, "built-in flavor", f"flavor {name!r} is built in and cannot be deleted; "
                                                      "PUT it to redefine it")
            raise HTTPException(404, f"flavor {name!r} not found")
        if name not in BUILTIN:
            users = await quotas.tenants_using(s, name)
            users += [f"cohort {cohort}" for cohort in await quotas.cohorts_using(s, name)]
            if users:
                raise Problem(409, "flavor in use", f"flavor {name!r} is used by the quotas of "
                                                    f"{', '.join(users)}; delete those first")
        audit(s, token, "delete", f"flavor/{name}", flavor_json(row), None)
        await flavors.delete_flavor(s, row)


# --- quotas -------------------------------------------------------------------------------------------


@router.get("/v1/quotas", response_model=list[QuotaOut], tags=["quotas"])
async def list_all_quotas(s: Session, token: Caller) -> list[QuotaOut]:
    return [QuotaOut.model_validate(q) for q in await quotas.quotas(s, token.tenant)]


@router.get("/v1/tenants/{name}/quotas", response_model=list[QuotaOut], tags=["quotas"])
async def list_quotas(name: Name, s: Session, token: Caller) -> list[QuotaOut]:
    visible(token, name)
    await _tenant_or_404(s, name)
    return [QuotaOut.model_validate(q) for q in await quotas.quotas(s, name)]


@router.put("/v1/tenants/{name}/quotas/{flavor}", response_model=QuotaOut, tags=["quotas"])
async def put_quota(name: Name, flavor: Name, body: QuotaIn, s: Session, token: Caller) -> QuotaOut:
    admin(token)
    if body.lending_limit is not None and body.lending_limit > body.nominal:
        raise Problem(422, "invalid quota", f"lendingLimit: {body.lending_limit} is more than the nominal "
                                            f"quota {body.nominal}")
    async with s.begin():
        await _tenant_or_404(s, name)
        config = await load_quota_config(s)
        if config.flavor(flavor) is None:
            known = ", ".join(f.name for f in config.flavors)
            raise Problem(422, "unknown flavor", f"flavor {flavor!r} is not defined; known flavors: {known}")
        before, row = await quotas.put_quota(s, name, flavor, body.nominal, body.borrowing_limit,
                                             body.lending_limit)
        after = QuotaOut.model_validate(row)
        audit(s, token, "put", f"quota/{name}/{flavor}", before, dump(after))
    return after


@router.delete("/v1/tenants/{name}/quotas/{flavor}", status_code=204, tags=["quotas"])
async def delete_quota(name: Name, flavor: Name, s: Session, token: Caller) -> None:
    admin(token)
    async with s.begin():
        row = await quotas.quota(s, name, flavor)
        if row is None:
            raise HTTPException(404, f"quota {name}/{flavor} not found")
        audit(s, token, "delete", f"quota/{name}/{flavor}", quota_json(row), None)
        await quotas.delete_quota(s, row)
