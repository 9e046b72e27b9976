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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.dra import v1 as dra
from shared.dra.budget import (
    CLAIM_BUDGET,
    ONE_SHOT_BUDGET,
    PIECE_LIMIT,
    STEP,
    BudgetExceeded,
    Meter,
    PieceTooLarge,
    Unmetered,
)
from shared.dra.cel import SelectorError
from shared.dra.fleet_index import IN_USE, DeviceIndex, Group
from shared.dra.inventory import UNHEALTHY, CounterKey, Fleet, FleetDevice
from shared.dra.matching import SelectorMemo
from shared.dra.plan import Alternative, Plan, prepare, spec_key
from shared.dra.quantity import exact
from shared.dra.reasons import pending_reason
from shared.dra.results import (
    Allocation,
    Amount,
    Decision,
    DeviceFilter,
    DeviceKey,
    DeviceResult,
    Outcome,
    Rejected,
    State,
)
from shared.dra.search import Constraints, NodeCounters, counters_fit, search_node
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
    """The fleet during one decision cycle: what is taken, what each kind of request may still use.

    Built from immutable inputs (a Fleet, the classes, the devices already allocated); decisions are
    seen by the ones after them through take() and give_back(). Indexes are built on first use, so a
    cycle pays only for the kinds of request it meets.
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
        self.unusable_nodes = dict(unusable_nodes or {})  # node -> why (stale inventory)
        self.budget = budget  # what one decision may spend when its caller gives it no meter
        self.meter: Meter = Unmetered()  # the decision under way's (metered())
        self.clock = 0  # counts releases: a node's last one is freed_at[node] (shared/dra/sweep.py)
        self.freed_at: dict[str, int] = {}
        self._kept: dict[int, PlanKept] = {}  # per plan (by id, checked by identity)
        self._by_acceptance: dict[Any, DeviceIndex] = {}  # indexes by what they hold (DeviceIndex.acceptance)
        self._readers: dict[int, int] = {}  # per index (by id): the plans and filters that read it
        self.in_use: set[DeviceKey] = set()
        self.usage: dict[str, int] = {}
        self._counters: dict[str, dict[CounterKey, Amount]] = {}
        self._indexes: dict[tuple[Any, ...], DeviceIndex | SelectorError] = {}
        self._index_of: dict[tuple[int, str | None, Any], tuple[Alternative, tuple[Any, ...]]] = {}  # -> index key
        self._shape_indexes: dict[int, list[DeviceIndex]] = {}
        self._counter_peers: dict[tuple[str, tuple[str, str, str]], list[FleetDevice]] = {}
        self.version = 0  # bumped on every take or give back: reasons cached per version stay true
        self.hints: dict[Any, str] = {}  # did-you-mean and closest-device hints: they depend on the fleet only
        self._counter_fit: dict[DeviceKey, bool] = {}  # per device, dropped when its counter set changes
        self._only: DeviceFilter | None = None
        self._free = sum(1 for n in fleet.nodes.values() if n.node not in self.unusable_nodes
                         for d in n.devices if d.health != UNHEALTHY)
        for node in fleet.nodes.values():
            if node.counters:
                self._counters[node.node] = {k: exact(q.value) for k, q in node.counters.items()}
        by_key = fleet.by_key
        for key in in_use:
            device = by_key.get(key)
            if device is not None:
                self._mark(device, taken=True)

    @property
    def filter_key(self) -> Any:
        return self._only.key if self._only else None

    @contextlib.contextmanager
    def metered(self, meter: Meter) -> Iterator[Meter]:
        """Charge the work done inside (compiling, evaluating selectors, searching) to `meter`."""
        outer, outer_memo = self.meter, self.memo.meter
        self.meter = self.memo.meter = meter
        try:
            yield meter
        finally:
            self.meter, self.memo.meter = outer, outer_memo

    # -- availability -------------------------------------------------------------------------------

    def idle(self, node: str) -> bool:
        """Nothing on the node is in use and it may be used: every healthy device of it is free."""
        return not self.usage.get(node) and node not in self.unusable_nodes

    def _only_use(self, node: str) -> bool:
        """Whether an accepted device of the node that is not free can only be in use: no shared counters
        on it and its inventory is current (health is judged when an index is built)."""
        return node not in self._counters and node not in self.unusable_nodes

    def unavailable(self, device: FleetDevice) -> str | None:
        """Why an accepted device cannot be given now, or None when it can."""
        if device.key in self.in_use:
            return IN_USE
        if device.node in self.unusable_nodes:
            return "stale inventory"
        if device.health == UNHEALTHY:
            return "unhealthy"
        if device.counter_draws:
            fits = self._counter_fit.get(device.key)
            if fits is None:
                left = self._counters.get(device.node, {})
                fits = self._counter_fit[device.key] = counters_fit(left, device)
            if not fits:
                return "shared counters"
        return None

    def _mark(self, device: FleetDevice, *, taken: bool) -> None:
        sign = 1 if taken else -1
        if taken:
            self.in_use.add(device.key)
        else:
            self.in_use.discard(device.key)
            self.clock += 1
            self.freed_at[device.node] = self.clock
        if device.node not in self.unusable_nodes and device.health != UNHEALTHY:
            self._free -= sign
        self.usage[device.node] = self.usage.get(device.node, 0) + sign
        left = self._counters.get(device.node)
        if left is not None and device.counter_draws:
            for key, amount in device.counter_draws:
                left[key] = left.get(key, 0) - sign * amount
            for peer in self._peers(device.node, device):  # their fit may have changed with the counters
                self._counter_fit.pop(peer.key, None)

    def _changed(self, nodes: Iterable[str]) -> None:
        self.version += 1
        for node in sorted(set(nodes)):  # a fixed order: buckets fill in it, so placement stays deterministic
            self._touch(node)

    def _touch(self, node: str) -> None:
        inventory = self.fleet.nodes.get(node)
        if inventory is not None:
            for index in self._shape_indexes.get(inventory.shape_id, ()):
                index.touch(node)

    @property
    def free_devices(self) -> int:
        """Healthy devices not in use on usable nodes: with none left, no ordinary request can be placed."""
        return self._free

    def sync(self, in_use: Iterable[DeviceKey]) -> None:
        """Make what is taken equal `in_use`, touching only what differs: a state kept from the last
        cycle (same fleet) is brought up to date in O(changes) instead of rebuilt."""
        wanted = set(in_use) & self.fleet.by_key.keys()
        by_key = self.fleet.by_key
        nodes = set()
        for key in sorted(self.in_use - wanted):
            self._mark(by_key[key], taken=False)
            nodes.add(by_key[key].node)
        for key in sorted(wanted - self.in_use):
            self._mark(by_key[key], taken=True)
            nodes.add(by_key[key].node)
        if nodes:
            self._changed(nodes)

    def take(self, allocation: Allocation) -> None:
        """Hold an allocation's devices (admin-access results hold none)."""
        by_key = self.fleet.by_key
        for key in allocation.keys:
            device = by_key.get(key)
            if device is not None and key not in self.in_use:
                self._mark(device, taken=True)
        self.version += 1
        self._touch(allocation.node)

    def give_back(self, allocation: Allocation) -> None:
        by_key = self.fleet.by_key
        for key in allocation.keys:
            device = by_key.get(key)
            if device is not None and key in self.in_use:
                self._mark(device, taken=False)
        self.version += 1
        self._touch(allocation.node)

    def index(self, alternative: Alternative, group_attribute: str | None = None) -> DeviceIndex:
        """The index of devices an alternative accepts (within the current decision's filter); raises
        Rejected on a CEL runtime error."""
        only = self._only
        only_key = only.key if only else None
        known = self._index_of.get((id(alternative), group_attribute, only_key))
        found: DeviceIndex | SelectorError | None = None
        if known is not None and known[0] is alternative:  # the same request object: no key to build
            found = self._indexes.get(known[1])
        if found is None:
            key = (*alternative.index_key(group_attribute), only_key)
            found = self._index_by_key(key, alternative, group_attribute, only)
            if len(self._index_of) > 50_000:  # requests of specs long gone: bounded like the plan memo
                self._index_of.clear()
            self._index_of[(id(alternative), group_attribute, only_key)] = (alternative, key)
        if isinstance(found, SelectorError):
            raise Rejected(f"request {alternative.result_name!r}: {found}")
        assert found is not None
        return found

    def _index_by_key(self, key: tuple[Any, ...], alternative: Alternative, group_attribute: str | None,
                      only: DeviceFilter | None) -> DeviceIndex | SelectorError:
        found = self._indexes.get(key)
        if found is None:
            try:
                found = DeviceIndex(alternative.selectors, alternative.body.tolerations, group_attribute,
                                    self.fleet, self.memo, self.unavailable, self.idle,
                                    only.accepts if only else None, self._only_use, self.in_use)
            except SelectorError as error:
                found = error
            else:
                alike = (found.acceptance, alternative.body.tolerations, group_attribute, only.key if only else None)
                same = self._by_acceptance.get(alike)
                if same is not None:
                    found = same  # another request accepts the same devices: one index serves both
                else:
                    found.alike = alike
                    self._by_acceptance[alike] = found
                    for shape in found.shapes:
                        self._shape_indexes.setdefault(shape, []).append(found)
                found.keys.append(key)
            self._indexes[key] = found
        return found

    def _read_by(self, indexes: Iterable[DeviceIndex], change: int) -> None:
        """Count the plans that read these indexes; one no plan reads any more is dropped (built again from
        the selector memo if a claim needs it later), so an index lives as long as claims that use it wait."""
        for index in set(indexes):
            readers = self._readers.get(id(index), 0) + change
            if readers > 0:
                self._readers[id(index)] = readers
                continue
            self._readers.pop(id(index), None)
            for key in index.keys:
                if self._indexes.get(key) is index:
                    del self._indexes[key]
            if self._by_acceptance.get(index.alike) is index:
                del self._by_acceptance[index.alike]
            for shape in index.shapes:
                kept = self._shape_indexes.get(shape)
                if kept is not None and index in kept:
                    kept.remove(index)

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
            self._read_by(found, 1)
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
                found = self._place(plan, number, variant, indexes, sweep)
                if found is not None:
                    return self._allocated(claim, plan, found)
        except Rejected as rejected:
            return Decision(State.REJECTED, reason=str(rejected))
        except BudgetExceeded:
            return Decision(State.PENDING, reason=self.cut_reason(plan), cut=True)
        if not explain:
            return Decision(State.PENDING)
        try:
            reason, unsatisfiable = pending_reason(self, plan)
        except Rejected as rejected:
            return Decision(State.REJECTED, reason=str(rejected))
        except BudgetExceeded:
            return Decision(State.PENDING, reason=self.cut_reason(plan), cut=True)
        given_up = sum(len(sweep.given_up) for sweep in self.kept(plan).sweeps.values())
        if given_up:
            reason += (f"; the search of {given_up} node(s) was given up after {PIECE_LIMIT:,} steps each (the "
                       "claim's constraints leave too many combinations there): they count as having no room")
        return Decision(State.PENDING, reason=reason, unsatisfiable=unsatisfiable)

    def _allocated(self, claim: dra.ResourceClaim, plan: Plan, found: tuple[str, list[tuple[str, FleetDevice]]]
                   ) -> Decision:
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
            self._read_by(indexes, -1)

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

    def _place(self, plan: Plan, number: int, variant: Sequence[Alternative], indexes: list[DeviceIndex],
               sweep: Sweep) -> tuple[str, list[tuple[str, FleetDevice]]] | None:
        grouping = plan.group_attribute(variant)
        if grouping is None or isinstance(grouping, str):
            if sweep.swept_at.get(number, -1) >= self.clock:
                return None  # it found no room, and nothing was freed anywhere since
            found = self._place_simple(variant[0], indexes[0], plan)
            if found is None:
                sweep.finished(number, self.clock)
                self.meter.progressed()
            return found
        return self._place_searching(plan, number, variant, indexes, sweep)

    def _place_simple(self, alternative: Alternative, index: DeviceIndex, plan: Plan
                      ) -> tuple[str, list[tuple[str, FleetDevice]]] | None:
        """One ExactCount request, at most one matchAttribute: the best group with room is the answer,
        unless shared counters make its free devices exclude each other."""
        wanted = alternative.body.wanted
        for group in index.best_groups(wanted):
            self.meter.spend(STEP)
            picked = self._pick(group, wanted, alternative, plan)
            if picked is not None:
                return group.node, [(alternative.result_name, d) for d in picked]
        return None

    def _pick(self, group: Group, wanted: int, alternative: Alternative, plan: Plan) -> list[FleetDevice] | None:
        left = self._counters.get(group.node)
        if left is None or not any(d.counter_draws for d in group.free):
            return group.free[:wanted]
        counters = NodeCounters(dict(left))
        candidates = self._partition_order(group.node, group.free, counters)
        found = search_node([alternative], {alternative.result_name: candidates},
                             Constraints(plan.constraints), counters, self.meter)
        return [d for _, d in found] if found is not None else None

    def _partition_order(self, node: str, free: list[FleetDevice], counters: NodeCounters) -> list[FleetDevice]:
        """Among equally good fits, the partition that leaves the most other partitions possible first:
        a 1g slice goes where it does not break the 4g and 3g placements (NVIDIA's slot geometry, read
        from the counters, not hard-coded)."""
        best = free[0].fit_rank
        ties = [d for d in free if d.fit_rank == best]
        if len(ties) < 2 or not ties[0].counter_draws:
            return free
        scored = sorted(ties, key=lambda d: (-self._room_left(node, d, counters.left), d.name))
        return scored + [d for d in free if d.fit_rank != best]

    def _room_left(self, node: str, device: FleetDevice, left: Mapping[CounterKey, Amount]) -> int:
        """How much partitioning stays possible beside `device`: the placements still open, weighted by
        their size in slot counters (counters of capacity one, like NVIDIA's memory slices)."""
        slots = {key for key, amount in device.counter_draws if amount == 1}
        score = 0
        for peer in self._peers(node, device):
            if peer.key in self.in_use or peer is device:
                continue
            peer_slots = [key for key, amount in peer.counter_draws if amount == 1]
            if all(left.get(key, 0) >= 1 and key not in slots for key in peer_slots):
                score += len(peer_slots) ** 2
        return score

    def _peers(self, node: str, device: FleetDevice) -> list[FleetDevice]:
        """Devices of the node that draw on any counter set this device draws on."""
        peers: list[FleetDevice] = []
        for counter_set in {key[:3] for key, _ in device.counter_draws}:
            members = self._counter_peers.get((node, counter_set))
            if members is None:
                members = self._counter_peers[(node, counter_set)] = [
                    d for d in self.fleet.nodes[node].devices if any(k[:3] == counter_set for k, _ in d.counter_draws)]
            peers.extend(members)
        return peers

    def _place_searching(self, plan: Plan, number: int, variant: Sequence[Alternative], indexes: list[DeviceIndex],
                         sweep: Sweep) -> tuple[str, list[tuple[str, FleetDevice]]] | None:
        """The general case: several requests, All mode, adminAccess or distinctAttribute. Nodes come in
        the first request's preference order; each node is searched on its own, and only where the sweep
        has not found it without room since its last release."""
        lead = next((i for i, a in enumerate(variant) if not a.admin_access), None)
        if lead is None:
            nodes: Iterable[str] = sorted(set.intersection(*(set(ix.node_names()) for ix in indexes)))
        else:
            nodes = (g.node for g in indexes[lead].best_groups(variant[lead].wanted))
        constraints = Constraints(plan.constraints)
        freed_at, meter = self.freed_at, self.meter
        searched = False
        for node in nodes:
            if sweep.skips(number, node, freed_at.get(node, 0)):
                continue
            meter.spend(STEP)
            searched = True
            candidates: dict[str, list[FleetDevice]] = {}
            for alternative, index in zip(variant, indexes, strict=True):
                if alternative.admin_access:
                    here = [d for d in index.devices_on(node) if self.unavailable(d) in (None, IN_USE)]
                else:
                    here = index.free_on(node)
                    if alternative.all_mode and len(here) != len(index.devices_on(node)):
                        here = []  # All needs every matching device of the node, none of them in use
                if len(here) < alternative.wanted:
                    break
                candidates[alternative.result_name] = here
            else:
                counters = NodeCounters(dict(self._counters.get(node, {})))
                try:
                    found = search_node(variant, candidates, constraints, counters, meter)
                except PieceTooLarge:  # its combinations have no end: it counts as having no room
                    sweep.given_up.add(node)
                    found = None
                if found is not None:
                    return node, found
            sweep.searched(number, node, self.clock)
            meter.progressed()
        sweep.finished(number, self.clock)
        if searched:
            meter.progressed()
        return None


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
