"""The pure allocation decision: which devices a ResourceClaim gets, or why it waits or is refused.

Semantics follow the Kubernetes structured allocator (resource.k8s.io/v1): class selectors before
request selectors, ExactCount and All, firstAvailable tried in order (the first subrequest that any
node can satisfy wins), matchAttribute and distinctAttribute constraints, NoSchedule/NoExecute taints,
shared counters of partitionable devices (MIG), adminAccess, 32 requests and 32 devices per claim.

Where DRA is first-fit we place best-fit, deterministically (see shared/dra/fleet_index.py): the smallest
adequate healthy device first, then the group (node, or node and matchAttribute value) with the fewest
free devices that still has room, so partly used nodes fill before empty ones; MIG partitions are
placed where they leave the most other partitions possible. Unhealthy devices and nodes with stale
inventory are never used, throttled devices last.

Speed: a claim of one request (the common case) is placed from the index without search. Other
claims search one node at a time, combinations not permutations, pruned by counts, under a step
budget; running out of budget is a reason, not a hang. No I/O happens here.

The parts: what is taken (occupancy.py), the indexes built so far (index_cache.py), where a variant fits
(placement.py) and why a claim waits (reasons.py). FleetState holds them for one cycle and keeps per plan
what the decisions of its claims reuse (indexes read, sweeps, distinct variants, reasons, configs).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from shared.dra import v1 as dra
from shared.dra.budget import CLAIM_BUDGET, ONE_SHOT_BUDGET, PIECE_LIMIT, STEP, BudgetExceeded, Meter, Unmetered
from shared.dra.fleet_index import DeviceIndex
from shared.dra.index_cache import IndexCache
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo
from shared.dra.occupancy import Occupancy
from shared.dra.placement import Placed, place
from shared.dra.plan import Alternative, Plan, prepare, spec_key
from shared.dra.reasons import pending_reason
from shared.dra.results import (
    Allocation,
    Decision,
    DeviceFilter,
    DeviceKey,
    DeviceResult,
    Outcome,
    Rejected,
    State,
)
from shared.dra.sweep import Sweep


def _config_for(
    claim: dra.ResourceClaim, classes: Mapping[str, dra.DeviceClass], used: Sequence[Alternative]
) -> tuple[dict[str, Any], ...]:
    """Class configs first (FromClass), then the claim's own (FromClaim), as DRA writes them; a class
    config that covers every request of the claim names none (it applies to all)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for alternative in used:
        if alternative.class_name in seen:
            continue
        seen.add(alternative.class_name)
        names = [a.result_name for a in used if a.class_name == alternative.class_name]
        covered = [] if len(names) == len(used) else names
        for config in classes[alternative.class_name].spec.config:
            out.append({"source": "FromClass", "requests": covered,
                        "opaque": config.opaque.model_dump(by_alias=True, exclude_none=True)})
    for claim_config in claim.spec.devices.config:
        out.append({"source": "FromClaim", "requests": list(claim_config.requests),
                    "opaque": claim_config.opaque.model_dump(by_alias=True, exclude_none=True)})
    return tuple(out)


@dataclass
class Variants:
    """A plan's variants that search differently, found in order (`next`: the first not looked at yet)."""

    next: int = 0
    shapes: set[Any] = field(default_factory=set)
    distinct: list[tuple[int, tuple[Alternative, ...], list[DeviceIndex]]] = field(default_factory=list)


@dataclass
class PlanKept:
    """What the fleet's state keeps for one plan while claims of it wait, per filter where it depends on one;
    `FleetState.forget` drops it all, and the indexes no other plan reads."""

    plan: Plan
    indexes: dict[Any, tuple[DeviceIndex, ...]] = field(default_factory=dict)  # what a placement reads
    sweeps: dict[Any, Sweep] = field(default_factory=dict)
    variants: dict[Any, Variants] = field(default_factory=dict)
    reasons: dict[Any, tuple[int, tuple[str, bool]]] = field(default_factory=dict)  # per filter: version, reason
    configs: dict[frozenset[str], tuple[frozenset[str], tuple[dict[str, Any], ...]]] = field(default_factory=dict)


class FleetState:
    """The fleet during one decision cycle: what is taken (`occupancy`), the indexes built so far
    (`indexes`), and what is kept per plan while its claims wait.

    Built from immutable inputs (a Fleet, the classes, the devices already allocated); decisions are
    seen by the ones after them through take() and give_back().
    """

    def __init__(
        self,
        fleet: Fleet,
        classes: Mapping[str, dra.DeviceClass],
        in_use: Iterable[DeviceKey] = (),
        *,
        memo: SelectorMemo | None = None,
        unusable_nodes: Mapping[str, str] | None = None,
        budget: int = CLAIM_BUDGET,
    ) -> None:
        self.fleet = fleet
        self.classes = classes
        self.memo = memo if memo is not None else SelectorMemo()
        self.occupancy = Occupancy(fleet, unusable_nodes or {}, in_use)
        self.unusable_nodes = self.occupancy.unusable_nodes  # node -> why (stale inventory)
        self.in_use = self.occupancy.in_use
        self.indexes = IndexCache(fleet, self.memo, self.occupancy)
        self.budget = budget  # what one decision may spend when its caller gives it no meter
        self.meter: Meter = Unmetered()  # the decision under way's (metered())
        self.version = 0  # bumped on every take or give back: reasons cached per version stay true
        self.hints: dict[Any, str] = {}  # did-you-mean and closest-device hints: they depend on the fleet only
        self._kept: dict[int, PlanKept] = {}  # per plan (by id, checked by identity)
        self._only: DeviceFilter | None = None

    @property
    def filter_key(self) -> Any:
        return self._only.key if self._only else None

    def metered(self, meter: Meter) -> _Metered:
        """Charge the work done inside (compiling, evaluating selectors, searching) to `meter`."""
        return _Metered(self, meter)

    # -- what is taken ------------------------------------------------------------------------------

    def sync(self, in_use: Iterable[DeviceKey]) -> None:
        """Make what is taken equal `in_use`, touching only what differs: a state kept from the last
        cycle (same fleet) is brought up to date in O(changes) instead of rebuilt."""
        nodes = self.occupancy.sync(in_use)
        if nodes:
            self.version += 1
            for node in sorted(nodes):  # a fixed order: buckets fill in it, so placement stays deterministic
                self.indexes.touch(node)

    def take(self, allocation: Allocation) -> None:
        """Hold an allocation's devices (admin-access results hold none)."""
        self.occupancy.take(allocation.keys)
        self.version += 1
        self.indexes.touch(allocation.node)

    def give_back(self, allocation: Allocation) -> None:
        self.occupancy.give_back(allocation.keys)
        self.version += 1
        self.indexes.touch(allocation.node)

    # -- what is kept per plan ----------------------------------------------------------------------

    def index(self, alternative: Alternative, group_attribute: str | None = None) -> DeviceIndex:
        """The index of devices an alternative accepts (within the current decision's filter); raises
        Rejected on a CEL runtime error."""
        return self.indexes.index(alternative, group_attribute, self._only)

    def capacity_version(self, plan: Plan, only: DeviceFilter | None = None) -> tuple[int, ...]:
        """The versions of the indexes a placement of `plan` reads: while they are unchanged, so is the
        answer (a Pending claim need not be tried again). Raises Rejected."""
        kept, only_key = self.kept(plan), only.key if only else None
        found = kept.indexes.get(only_key)
        if found is None:
            outer, self._only = self._only, only
            try:
                indexes = []
                single = len(plan.requests) == 1  # only a claim of one request is placed from a grouped index
                for _, alternatives in plan.requests:
                    for alternative in alternatives:
                        indexes.append(self.index(alternative))
                        grouping = plan.group_attribute([alternative]) if single else None
                        if isinstance(grouping, str):
                            indexes.append(self.index(alternative, grouping))
            finally:
                self._only = outer
            found = kept.indexes[only_key] = tuple(indexes)
            self.indexes.read_by(found, 1)
        return tuple(index.version for index in found)

    def kept(self, plan: Plan) -> PlanKept:
        """What this state keeps for the plan (made on first use)."""
        found = self._kept.get(id(plan))
        if found is None or found.plan is not plan:
            if found is not None:  # the id of a plan dropped from the memo came back
                self.forget(found.plan)
            found = self._kept[id(plan)] = PlanKept(plan)
        return found

    # -- deciding -----------------------------------------------------------------------------------

    def plan(self, claim: dra.ResourceClaim) -> Plan:
        """Prepared once per distinct claim spec (and looked up by identity first: the same claim object
        comes back every cycle); raises Rejected."""
        known = self.memo.plan_of.get(id(claim))
        if known is not None and known[0] is claim:
            if isinstance(known[1], Rejected):
                raise known[1]
            return known[1]
        known_key = self.memo.key_of.get(id(claim))
        key = known_key[1] if known_key is not None and known_key[0] is claim else spec_key(claim)
        cached = self.memo.plans.get(key)
        if cached is None:
            try:
                cached = prepare(claim, self.classes, self.meter)
            except Rejected as rejected:
                cached = rejected
            except BudgetExceeded:  # it goes on at the next try: its key (a JSON dump of a large spec) is kept
                if len(self.memo.key_of) > 10_000:
                    self.memo.key_of.clear()
                self.memo.key_of[id(claim)] = (claim, key)
                raise
            if len(self.memo.plans) > 10_000:
                self.memo.plans.clear()
                self.memo.plans_cleared += 1  # what is kept per plan checks the plan's identity (kept())
            self.memo.plans[key] = cached
        if len(self.memo.plan_of) > 100_000:
            self.memo.plan_of.clear()
        self.memo.plan_of[id(claim)] = (claim, cached)
        if isinstance(cached, Rejected):
            raise cached
        return cached

    def decide(self, claim: dra.ResourceClaim, only: DeviceFilter | None = None, *, explain: bool = True,
               meter: Meter | None = None) -> Decision:
        """Decide one claim against what is free now (among the devices `only` accepts); the caller
        take()s an allocation it keeps. `explain=False` skips the pending reason (a trial placement).

        The work is charged to `meter` (else a meter of this state's budget); when it runs out, the claim
        is Pending with `cut=True` and its search goes on from there at the next call (`Sweep`)."""
        self._only = only
        try:
            with self.metered(meter if meter is not None else Meter(self.budget)):
                return self._decide(claim, explain)
        finally:
            self._only = None

    def _decide(self, claim: dra.ResourceClaim, explain: bool) -> Decision:
        plan: Plan | None = None
        try:
            plan = self.plan(claim)
            sweep = self._sweep(plan)
            for number, variant, indexes in self._distinct_variants(plan):
                self.meter.spend(STEP)
                found = place(self.occupancy, self.meter, plan, number, variant, indexes, sweep)
                if found is not None:
                    return self._allocated(claim, plan, found)
        except Rejected as rejected:
            return Decision(State.REJECTED, reason=str(rejected))
        except BudgetExceeded:
            return Decision(State.PENDING, reason=self.cut_reason(plan), cut=True)
        if not explain:
            return Decision(State.PENDING)
        try:
            reason, unsatisfiable = self._pending_reason(plan)
        except Rejected as rejected:
            return Decision(State.REJECTED, reason=str(rejected))
        except BudgetExceeded:
            return Decision(State.PENDING, reason=self.cut_reason(plan), cut=True)
        given_up = sum(len(sweep.given_up) for sweep in self.kept(plan).sweeps.values())
        if given_up:
            reason += (f"; the search of {given_up} node(s) was given up after {PIECE_LIMIT:,} steps each (the "
                       "claim's constraints leave too many combinations there): they count as having no room")
        return Decision(State.PENDING, reason=reason, unsatisfiable=unsatisfiable)

    def _pending_reason(self, plan: Plan) -> tuple[str, bool]:
        """The reason a claim of the plan waits (shared/dra/reasons.py), worked out again only when what
        is taken has changed since."""
        reasons = self.kept(plan).reasons
        cached = reasons.get(self.filter_key)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        result = pending_reason(self, plan)
        reasons[self.filter_key] = (self.version, result)
        return result

    def _allocated(self, claim: dra.ResourceClaim, plan: Plan, found: Placed) -> Decision:
        node, picked = found
        if len(picked) > dra.MAX_DEVICES_PER_CLAIM:
            return Decision(State.REJECTED, reason=(
                f"claim would get {len(picked)} devices, over the claim limit of {dra.MAX_DEVICES_PER_CLAIM}"))
        used_names = frozenset(name for name, _ in picked)
        configs = self.kept(plan).configs
        known = configs.get(used_names)
        if known is None:  # per spec and requests used: the same for every claim
            used = [a for _, alts in plan.requests for a in alts if a.result_name in used_names]
            known = configs[used_names] = (frozenset(a.result_name for a in used if a.admin_access),
                                           _config_for(claim, self.classes, used))
        admin, config = known
        results = tuple(DeviceResult(name, d.driver, d.pool, d.name, name in admin) for name, d in picked)
        return Decision(State.ALLOCATED, Allocation(node, results, config))

    def _sweep(self, plan: Plan) -> Sweep:
        """How far the search of this plan under the current filter got (kept while the fleet is the same)."""
        sweeps = self.kept(plan).sweeps
        found = sweeps.get(self.filter_key)
        if found is None:
            found = sweeps[self.filter_key] = Sweep()
        return found

    def forget(self, plan: Plan) -> None:
        """Drop what was kept for a plan no waiting claim has any more: its memory goes with its claims."""
        kept = self._kept.get(id(plan))
        if kept is None or kept.plan is not plan:
            return
        del self._kept[id(plan)]
        for indexes in kept.indexes.values():
            self.indexes.read_by(indexes, -1)

    def cut_reason(self, plan: Plan | None) -> str:
        """Why a claim cut short by its budget waits: the same words every cycle, so its status does not
        change while the search goes on."""
        if plan is None:
            return ("placement search exceeded its budget while its selectors were compiled and evaluated; it goes "
                    "on in the next cycles")
        size = f"{len(plan.requests)} requests"
        if len(plan.variants) > 1:
            size += f" in {len(plan.variants)}{'+' if plan.more_variants else ''} firstAvailable combinations"
        return (f"placement search exceeded its budget (a claim of {size}); it goes on in the next cycles, and is "
                "retried when devices that match it free")

    def _distinct_variants(self, plan: Plan) -> Iterator[tuple[int, tuple[Alternative, ...], list[DeviceIndex]]]:
        """The plan's variants in order, but for those that would search exactly like an earlier one (the
        same indexes asked the same way: firstAvailable subrequests whose selectors accept alike): such a
        variant finds room where the earlier one does, so it never needs a search of its own. Worked out as
        the search reaches them, once per plan and filter (a step per request looked at)."""
        kept = self.kept(plan).variants
        found = kept.get(self.filter_key)
        if found is None:
            found = kept[self.filter_key] = Variants()
        yield from list(found.distinct)
        variants = plan.variants
        while found.next < len(variants):
            number, variant = found.next, variants[found.next]
            self.meter.spend(STEP * len(variant))
            grouping = plan.group_attribute(variant)
            if grouping is None or isinstance(grouping, str):
                indexes = [self.index(variant[0], grouping)]
            else:
                indexes = [self.index(a) for a in variant]
            shape = (grouping, plan.search_shape(variant, indexes))
            self.meter.progressed()
            found.next += 1
            if shape not in found.shapes:
                found.shapes.add(shape)
                found.distinct.append((number, variant, indexes))
                yield number, variant, indexes


def decide(
    claim: dra.ResourceClaim,
    fleet: Fleet,
    classes: Mapping[str, dra.DeviceClass],
    in_use: Iterable[DeviceKey],
    *,
    memo: SelectorMemo | None = None,
    budget: int = ONE_SHOT_BUDGET,
) -> Decision:
    """Decide one claim against the fleet; `in_use` holds devices other claims already have."""
    return FleetState(fleet, classes, in_use, memo=memo, budget=budget).decide(claim)


def settle(
    claims: Iterable[dra.ResourceClaim],
    fleet: Fleet,
    classes: Mapping[str, dra.DeviceClass],
    in_use: Iterable[DeviceKey],
    *,
    memo: SelectorMemo | None = None,
    unusable_nodes: Mapping[str, str] | None = None,
) -> list[Outcome]:
    """Decide claims in the given order; each allocation is seen by the claims after it."""
    state = FleetState(fleet, classes, in_use, memo=memo, unusable_nodes=unusable_nodes, budget=ONE_SHOT_BUDGET)
    outcomes = []
    for claim in claims:
        decision = state.decide(claim)
        if decision.allocation is not None:
            state.take(decision.allocation)
        outcomes.append(Outcome(claim, decision))
    return outcomes


class _Metered:
    """FleetState.metered as a plain context manager: it is entered for every placement a cycle tries."""

    __slots__ = ("state", "meter", "outer", "outer_memo")

    def __init__(self, state: FleetState, meter: Meter) -> None:
        self.state, self.meter = state, meter

    def __enter__(self) -> Meter:
        state, meter = self.state, self.meter
        self.outer, self.outer_memo = state.meter, state.memo.meter
        state.meter = state.memo.meter = meter
        return meter

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
                 ) -> None:
        self.state.meter, self.state.memo.meter = self.outer, self.outer_memo
