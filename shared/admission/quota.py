"""Quotas as the contract's Quotas format has them: flavors in GPU units, cohorts (nested, with quotas of
their own), tenants with weights and per-flavor nominal, borrowing and lending limits, and the half-life
of past use in fair sharing. Pure data, parsing and export; no I/O.

A flavor is a named CEL selector over devices with a `value` in GPU units; a device counts against the
first flavor that accepts it. The built-in flavors cover each generation and each of its MIG profiles,
MIG profiles first (they are the more specific), and a MIG slice weighs its share of its parent (its
memory slices out of eight). A `flavors:` list is merged with the built-ins: listed flavors first, in
their order, then the built-ins not redefined by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from shared.fleet.topology import GPU_MODELS, GpuModel

KIND = "Quotas"
# GPU units per whole device: what each generation is worth next to an A100 80GB (1.0), roughly its
# training throughput; a quota admin overrides any of them with a flavor of the same name.
GENERATION_VALUES: Mapping[str, float] = {
    "A100-40GB": 0.8, "A100": 1.0, "H100": 2.0, "H200": 2.5, "B200": 4.0, "B300": 5.0,
}


class QuotaFileError(ValueError):
    """A Quotas document that cannot be used; the message names the field."""


DEFAULT_GANG_RESERVE_AFTER = 300.0  # seconds: the contract's 5m, for tenants without a gangReserveAfter


@dataclass(frozen=True)
class Flavor:
    name: str
    selector: str  # CEL over `device`, as in DRA selectors
    value: float = 1.0  # GPU units one device of this flavor weighs

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "selector": self.selector, "value": self.value}


@dataclass(frozen=True)
class QuotaLimit:
    """Kueue's three numbers, in devices of the flavor. None for borrowingLimit: may borrow whatever its
    cohort lends; None for lendingLimit: lends all of its unused nominal quota."""

    nominal: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nominal": self.nominal}
        if self.borrowing_limit is not None:
            out["borrowingLimit"] = self.borrowing_limit
        if self.lending_limit is not None:
            out["lendingLimit"] = self.lending_limit
        return out


@dataclass(frozen=True)
class CohortQuota:
    """A cohort as a node of the quota tree: its parent (None: a top cohort, under the fleet's free
    capacity) and its own quota per flavor, shared by its subtree. Its borrowingLimit caps what its
    subtree borrows from its parent; its lendingLimit what the subtree lends its parent (a top cohort
    lends nothing: top cohorts share only the free capacity)."""

    name: str
    parent: str | None = None
    quotas: Mapping[str, QuotaLimit] = field(default_factory=dict)

    def limit(self, flavor: str) -> QuotaLimit | None:
        return self.quotas.get(flavor)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.parent is not None:
            out["parent"] = self.parent
        if self.quotas:
            out["quotas"] = {flavor: limit.to_json() for flavor, limit in sorted(self.quotas.items())}
        return out


@dataclass(frozen=True)
class TenantQuota:
    name: str
    cohort: str | None = None
    weight: float = 1.0
    pending_alert_after: float | None = None  # seconds; None: the broker's default
    quotas: Mapping[str, QuotaLimit] = field(default_factory=dict)
    admin_access: bool = False  # may submit adminAccess requests (Kubernetes' namespace label, per tenant)
    max_pending: int | None = None  # waiting claims it may hold; a claim past it is Rejected; None: no limit
    # Preemption of its claims for fair share or reclaim (never priority within a tenant): not sooner than
    # min_runtime seconds after their allocation (None: the broker's default), and at most
    # max_preemptions_per_minute of them a minute (None: no limit).
    min_runtime: float | None = None
    max_preemptions_per_minute: int | None = None
    # A gang first in the tenant's order for this many seconds keeps the devices it needs as they free
    # (0: never; None: the broker's default).
    gang_reserve_after: float | None = None

    def limit(self, flavor: str) -> QuotaLimit | None:
        return self.quotas.get(flavor)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.cohort is not None:
            out["cohort"] = self.cohort
        out["weight"] = self.weight
        if self.pending_alert_after is not None:
            out["pendingAlertAfter"] = duration_text(self.pending_alert_after)
        if self.admin_access:
            out["adminAccess"] = True
        if self.max_pending is not None:
            out["maxPending"] = self.max_pending
        if self.min_runtime is not None:
            out["minRuntime"] = duration_text(self.min_runtime)
        if self.max_preemptions_per_minute is not None:
            out["maxPreemptionsPerMinute"] = self.max_preemptions_per_minute
        if self.gang_reserve_after is not None:
            out["gangReserveAfter"] = duration_text(self.gang_reserve_after)
        out["quotas"] = {flavor: limit.to_json() for flavor, limit in sorted(self.quotas.items())}
        return out


def duration_text(seconds: float) -> str:
    """A duration as the Quotas file writes it and reads it back: the largest whole unit (14d, 1h, 90s), else
    seconds in plain digits (`:g` wrote 1.2096e+06s for 14 days, which no duration parser reads)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"


def pending_limit_problem(tenant: TenantQuota, waiting: int) -> str | None:
    """Why one more waiting claim of this tenant is refused (it holds `waiting` already), or None. Flood
    control: one tenant's thousands of queued claims would slow every cycle for all."""
    if tenant.max_pending is None or waiting < tenant.max_pending:
        return None
    claims = "claim" if waiting == 1 else "claims"
    return (f"tenant {tenant.name} has {waiting:,} {claims} waiting, its maxPending of {tenant.max_pending:,}: this "
            f"claim is not queued; submit it again once some are admitted or released, or ask a quota admin to "
            f"raise maxPending")


def _gpu_selector(model: GpuModel) -> str:
    """Matches the real driver's productName and the topology's verbatim gpuModel alike."""
    if model.key == "A100-40GB":
        product = 'p.matches("(?i)a100.*40gb")'
    elif model.key == "A100":
        product = 'p.matches("(?i)a100") && !p.matches("(?i)40gb")'
    else:
        product = f'p.matches("(?i){model.key.lower()}")'
    return (f"device.driver == 'gpu.nvidia.com' && cel.bind(p, device.attributes['gpu.nvidia.com'].productName, "
            f"{product})")


def builtin_flavors() -> tuple[Flavor, ...]:
    """MIG profiles of every generation first, then whole GPUs, so each device lands in its own flavor."""
    mig, whole = [], []
    for model in GPU_MODELS:
        value = GENERATION_VALUES[model.key]
        base = _gpu_selector(model)
        for profile in model.profiles[:-1]:
            selector = (f"{base} && device.attributes['gpu.nvidia.com'].type == 'mig' && "
                        f"device.attributes['gpu.nvidia.com'].profile == '{profile.name}'")
            mig.append(Flavor(f"{model.key}-{profile.name}", selector, round(value * profile.memory_slices / 8, 4)))
        whole.append(Flavor(model.key, f"{base} && device.attributes['gpu.nvidia.com'].type == 'gpu'", value))
    return tuple(mig + whole)


BUILTIN_FLAVORS = builtin_flavors()


def merge_flavors(listed: Sequence[Flavor]) -> tuple[Flavor, ...]:
    names = {f.name for f in listed}
    return tuple(listed) + tuple(f for f in BUILTIN_FLAVORS if f.name not in names)


@dataclass(frozen=True)
class QuotaConfig:
    """Everything quota decisions read: flavors in order, cohorts and tenants."""

    flavors: tuple[Flavor, ...] = BUILTIN_FLAVORS
    cohorts: tuple[str, ...] = ()  # every cohort's name, as listed (then as tenants name them)
    tenants: Mapping[str, TenantQuota] = field(default_factory=dict)
    listed_flavors: tuple[Flavor, ...] = ()  # the ones the admin wrote, for export
    default_min_runtime: float = 0.0  # for tenants without a minRuntime: the broker's setting
    default_gang_reserve_after: float = DEFAULT_GANG_RESERVE_AFTER  # for tenants without a gangReserveAfter
    # Per cohort with a parent or quotas of its own: its place in the tree (a cohort not in it is a top
    # cohort without quotas, as every cohort was before cohorts nested).
    cohort_tree: Mapping[str, CohortQuota] = field(default_factory=dict)
    half_life: float = 0.0  # seconds: fairSharing.halfLife of past use; 0: shares count only what runs now

    def cohort(self, name: str) -> CohortQuota:
        found = self.cohort_tree.get(name)
        return found if found is not None else CohortQuota(name)

    @cached_property
    def nested(self) -> bool:
        """Some cohort has a parent or quotas of its own: quota arithmetic walks the tree."""
        return any(c.parent is not None or c.quotas for c in self.cohort_tree.values())

    def ancestors(self, cohort: str) -> list[str]:
        """The cohort and its ancestors, nearest first (parse_quotas refused cycles)."""
        out = [cohort]
        while (parent := self.cohort(out[-1]).parent) is not None and parent not in out:
            out.append(parent)
        return out

    def min_runtime(self, tenant: str) -> float:
        """Seconds a claim of `tenant` runs before fair share or reclaim may preempt it."""
        own = self.tenants.get(tenant)
        return own.min_runtime if own is not None and own.min_runtime is not None else self.default_min_runtime

    def gang_reserve_after(self, tenant: str) -> float:
        """Seconds a gang of `tenant` is first in its order before the devices it needs are kept for it (0: off)."""
        own = self.tenants.get(tenant)
        if own is not None and own.gang_reserve_after is not None:
            return own.gang_reserve_after
        return self.default_gang_reserve_after

    def preemptions_per_minute(self, tenant: str) -> int | None:
        own = self.tenants.get(tenant)
        return own.max_preemptions_per_minute if own is not None else None

    @cached_property
    def enforced(self) -> bool:
        """With no quota anywhere the fleet is open: any tenant may use any free device."""
        return any(t.quotas for t in self.tenants.values()) or any(c.quotas for c in self.cohort_tree.values())

    def tenant(self, name: str) -> TenantQuota:
        return self.tenants.get(name) or TenantQuota(name)

    def flavor(self, name: str) -> Flavor | None:
        return next((f for f in self.flavors if f.name == name), None)

    def to_document(self) -> dict[str, Any]:
        """The contract's Quotas YAML, for export; parse_quotas(to_document()) gives the same config."""
        doc: dict[str, Any] = {"kind": KIND}
        if self.listed_flavors:
            doc["flavors"] = [f.to_json() for f in self.listed_flavors]
        if self.half_life > 0:
            doc["fairSharing"] = {"halfLife": duration_text(self.half_life)}
        doc["cohorts"] = [self.cohort(c).to_json() for c in self.cohorts]
        doc["tenants"] = [self.tenants[name].to_json() for name in sorted(self.tenants)]
        return doc


def _number(value: Any, where: str, *, integer: bool = False, minimum: float = 0, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise QuotaFileError(f"{where}: expected {'an integer' if integer else 'a number'}, got {value!r}")
    if value < minimum:
        raise QuotaFileError(f"{where}: must be at least {minimum:g}, got {value!r}")
    return value


def _limit(value: Any, where: str) -> QuotaLimit:
    if not isinstance(value, Mapping):
        raise QuotaFileError(f"{where}: expected a mapping with nominal, borrowingLimit, lendingLimit")
    unknown = set(value) - {"nominal", "borrowingLimit", "lendingLimit"}
    if unknown:
        raise QuotaFileError(f"{where}.{sorted(unknown)[0]}: unknown field; use nominal, borrowingLimit, lendingLimit")
    nominal = _number(value.get("nominal", 0), f"{where}.nominal", integer=True)
    lending = _number(value.get("lendingLimit"), f"{where}.lendingLimit", integer=True, allow_none=True)
    if lending is not None and lending > nominal:
        raise QuotaFileError(f"{where}.lendingLimit: {lending} is more than the nominal quota {nominal}")
    return QuotaLimit(nominal, _number(value.get("borrowingLimit"), f"{where}.borrowingLimit", integer=True,
                                       allow_none=True), lending)


def parse_quotas(document: Any, *, where: str = "Quotas") -> QuotaConfig:
    """Read a Quotas document; raises QuotaFileError naming the field. CEL selectors are checked by the
    caller (shared.dra.cel.compile_selector), which knows how to report them."""
    from shared.settings import parse_duration

    if not isinstance(document, Mapping) or document.get("kind") != KIND:
        raise QuotaFileError(f"{where}: kind: expected {KIND!r}")
    listed = []
    for i, raw in enumerate(document.get("flavors") or []):
        at = f"{where}: flavors[{i}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise QuotaFileError(f"{at}.name: required")
        if not isinstance(raw.get("selector"), str) or not raw["selector"].strip():
            raise QuotaFileError(f"{at}.selector: a CEL expression is required")
        listed.append(Flavor(raw["name"], raw["selector"], float(_number(raw.get("value", 1.0), f"{at}.value"))))
    if len({f.name for f in listed}) != len(listed):
        raise QuotaFileError(f"{where}: flavors: a flavor name is listed twice")
    flavors = merge_flavors(listed)
    flavor_names = {f.name for f in flavors}
    half_life = _half_life(document.get("fairSharing"), where)
    cohorts: list[str] = []
    tree: dict[str, CohortQuota] = {}
    for i, raw in enumerate(document.get("cohorts") or []):
        at = f"{where}: cohorts[{i}]"
        name = raw.get("name") if isinstance(raw, Mapping) else raw
        if not isinstance(name, str) or not name:
            raise QuotaFileError(f"{at}.name: required")
        cohort = _cohort(raw, name, at, flavor_names) if isinstance(raw, Mapping) else CohortQuota(name)
        if name in cohorts:
            if cohort != CohortQuota(name) or name in tree:
                raise QuotaFileError(f"{at}.name: cohort {name!r} is listed twice")
            continue
        cohorts.append(name)
        if cohort.parent is not None or cohort.quotas:
            tree[name] = cohort
    tenants: dict[str, TenantQuota] = {}
    for i, raw in enumerate(document.get("tenants") or []):
        at = f"{where}: tenants[{i}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise QuotaFileError(f"{at}.name: required")
        name = raw["name"]
        if name in tenants:
            raise QuotaFileError(f"{at}.name: tenant {name!r} is listed twice")
        home = raw.get("cohort")
        if home is not None and not isinstance(home, str):
            raise QuotaFileError(f"{at}.cohort: expected a cohort name")
        if home is not None and home not in cohorts:
            cohorts.append(home)  # naming a cohort creates it, as the admin API does
        quotas = {}
        for flavor, limit in (raw.get("quotas") or {}).items():
            if flavor not in flavor_names:
                raise QuotaFileError(f"{at}.quotas.{flavor}: unknown flavor; define it under flavors: or use a "
                                     f"built-in one such as H100 or H100-3g.40gb")
            quotas[str(flavor)] = _limit(limit, f"{at}.quotas.{flavor}")
        pending = raw.get("pendingAlertAfter")
        try:
            pending_s = parse_duration(pending) if pending is not None else None
        except ValueError as error:
            raise QuotaFileError(f"{at}.pendingAlertAfter: {error}") from None
        admin_access = raw.get("adminAccess", False)
        if not isinstance(admin_access, bool):
            raise QuotaFileError(f"{at}.adminAccess: expected true or false")
        max_pending = raw.get("maxPending")
        if max_pending is not None and (isinstance(max_pending, bool) or not isinstance(max_pending, int)
                                        or not 0 <= max_pending <= 2**31 - 1):
            raise QuotaFileError(f"{at}.maxPending: expected a whole number of claims, 0 or more")
        min_runtime = raw.get("minRuntime")
        try:
            min_runtime_s = parse_duration(min_runtime) if min_runtime is not None else None
        except ValueError as error:
            raise QuotaFileError(f"{at}.minRuntime: {error}") from None
        reserve = raw.get("gangReserveAfter")
        try:
            reserve_s = parse_duration(reserve) if reserve is not None else None
        except ValueError as error:
            raise QuotaFileError(f"{at}.gangReserveAfter: {error}") from None
        most = raw.get("maxPreemptionsPerMinute")
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or not 0 <= most <= 2**31 - 1):
            raise QuotaFileError(f"{at}.maxPreemptionsPerMinute: expected a whole number of claims, 0 or more")
        tenants[name] = TenantQuota(name, home, float(_number(raw.get("weight", 1.0), f"{at}.weight",
                                                                minimum=0.001)), pending_s, quotas, admin_access,
                                    max_pending, min_runtime_s, most, reserve_s)
    _check_tree(tree, cohorts, where)
    return QuotaConfig(flavors, tuple(cohorts), tenants, tuple(listed), cohort_tree=tree, half_life=half_life)


def _half_life(raw: Any, where: str) -> float:
    """fairSharing.halfLife in seconds (absent: 0, past use off)."""
    from shared.settings import parse_duration

    if raw is None:
        return 0.0
    if not isinstance(raw, Mapping):
        raise QuotaFileError(f"{where}: fairSharing: expected a mapping such as {{halfLife: 24h}}")
    unknown = set(raw) - {"halfLife"}
    if unknown:
        raise QuotaFileError(f"{where}: fairSharing.{sorted(unknown)[0]}: unknown field; use halfLife")
    value = raw.get("halfLife")
    if value is None:
        return 0.0
    try:
        seconds = float(parse_duration(value))
    except (ValueError, TypeError) as error:
        raise QuotaFileError(f"{where}: fairSharing.halfLife: {error}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise QuotaFileError(f"{where}: fairSharing.halfLife: expected a duration such as 24h, got {value!r}")
    return seconds


def _cohort(raw: Mapping[str, Any], name: str, at: str, flavor_names: set[str]) -> CohortQuota:
    unknown = set(raw) - {"name", "parent", "quotas"}
    if unknown:
        raise QuotaFileError(f"{at}.{sorted(unknown)[0]}: unknown field; use name, parent, quotas")
    parent = raw.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise QuotaFileError(f"{at}.parent: expected a cohort name")
    quotas = raw.get("quotas") or {}
    if not isinstance(quotas, Mapping):
        raise QuotaFileError(f"{at}.quotas: expected a mapping of flavor to nominal, borrowingLimit, lendingLimit")
    limits = {}
    for flavor, limit in quotas.items():
        if flavor not in flavor_names:
            raise QuotaFileError(f"{at}.quotas.{flavor}: unknown flavor; define it under flavors: or use a "
                                 f"built-in one such as H100 or H100-3g.40gb")
        limits[str(flavor)] = _limit(limit, f"{at}.quotas.{flavor}")
    return CohortQuota(name, parent, limits)


def _check_tree(tree: Mapping[str, CohortQuota], cohorts: Sequence[str], where: str) -> None:
    """Every parent is a cohort of the document, and no cohort is its own ancestor."""
    known = set(cohorts)
    for i, name in enumerate(cohorts):
        parent = tree[name].parent if name in tree else None
        if parent is not None and parent not in known:
            raise QuotaFileError(f"{where}: cohorts[{i}].parent: cohort {name!r} names parent {parent!r}, which "
                                 f"is no cohort of the document; list it under cohorts:")
    for name in cohorts:
        path = [name]
        while name in tree and (parent := tree[name].parent) is not None:
            if parent in path:
                loop = " -> ".join(path[path.index(parent):] + [parent])
                raise QuotaFileError(f"{where}: cohorts: a cohort may not be its own ancestor: {loop}")
            path.append(parent)
            name = parent
