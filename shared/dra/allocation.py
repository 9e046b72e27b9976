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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.dra import model as dra
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
from shared.dra.search import (
    DEFAULT_SEARCH_BUDGET,
    BudgetExceeded,
    Constraints,
    NodeCounters,
    counters_fit,
    search_node,
)


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
        budget: int = DEFAULT_SEARCH_BUDGET,
    ) -> None:
        self.fleet = fleet
        self.classes = classes
        self.memo = memo if memo is not None else SelectorMemo()
        self.unusable_nodes = dict(unusable_nodes or {})  # node -> why (stale inventory)
        self.budget = budget
        self.in_use: set[DeviceKey] = set()
        self.usage: dict[str, int] = {}
        self._counters: dict[str, dict[CounterKey, Amount]] = {}
        self._indexes: dict[tuple[Any, ...], DeviceIndex | SelectorError] = {}
        self._index_of: dict[tuple[int, str | None, Any], tuple[Alternative, DeviceIndex | SelectorError]] = {}
        self._shape_indexes: dict[int, list[DeviceIndex]] = {}
        self._counter_peers: dict[tuple[str, tuple[str, str, str]], list[FleetDevice]] = {}
        self.version = 0  # bumped on every take or give back: reasons cached per version stay true
        self.reason_cache: dict[tuple[int, Any], tuple[int, tuple[str, bool]]] = {}
        self.hints: dict[Any, str] = {}  # did-you-mean and closest-device hints: they depend on the fleet only
        self._counter_fit: dict[DeviceKey, bool] = {}  # per device, dropped when its counter set changes
        self._only: DeviceFilter | None = None
        self._plan_indexes: dict[tuple[int, Any], tuple[Plan, tuple[DeviceIndex, ...]]] = {}
        self._configs: dict[tuple[int, frozenset[str]], tuple[Plan, frozenset[str], tuple[dict[str, Any], ...]]] = {}
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
        if known is not None and known[0] is alternative:  # the same request object: no key to build
            found: DeviceIndex | SelectorError | None = known[1]
        else:
            found = self._index_by_key(alternative, group_attribute, only)
            if len(self._index_of) > 50_000:  # requests of specs long gone: bounded like the plan memo
                self._index_of.clear()
            self._index_of[(id(alternative), group_attribute, only_key)] = (alternative, found)
        if isinstance(found, SelectorError):
            raise Rejected(f"request {alternative.result_name!r}: {found}")
        assert found is not None
        return found

    def _index_by_key(self, alternative: Alternative, group_attribute: str | None, only: DeviceFilter | None
                      ) -> DeviceIndex | SelectorError:
        key = (*alternative.index_key(group_attribute), only.key if only else None)
        found = self._indexes.get(key)
        if found is None:
            try:
                found = DeviceIndex(alternative.selectors, alternative.body.tolerations, group_attribute,
                                    self.fleet, self.memo, self.unavailable, self.idle,
                                    only.accepts if only else None, self._only_use, self.in_use)
            except SelectorError as error:
                found = error
            else:
                for shape in found.shapes:
                    self._shape_indexes.setdefault(shape, []).append(found)
            self._indexes[key] = found
        return found

    def capacity_version(self, plan: Plan, only: DeviceFilter | None = None) -> tuple[int, ...]:
        """The versions of the indexes a placement of `plan` reads: while they are unchanged, so is the
        answer (a Pending claim need not be tried again). Raises Rejected."""
        key = (id(plan), only.key if only else None)
        found = self._plan_indexes.get(key)
        if found is None or found[0] is not plan:
            self._only = only
            try:
                indexes = []
                for _, alternatives in plan.requests:
                    for alternative in alternatives:
                        indexes.append(self.index(alternative))
                        grouping = plan.group_attribute([alternative])
                        if isinstance(grouping, str):
                            indexes.append(self.index(alternative, grouping))
            finally:
                self._only = None
            found = self._plan_indexes[key] = (plan, tuple(indexes))
        return tuple(index.version for index in found[1])

    # -- deciding -----------------------------------------------------------------------------------

    def plan(self, claim: dra.ResourceClaim) -> Plan:
        """Prepared once per distinct claim spec (and looked up by identity first: the same claim object
        comes back every cycle); raises Rejected."""
        known = self.memo.plan_of.get(id(claim))
        if known is not None and known[0] is claim:
            if isinstance(known[1], Rejected):
                raise known[1]
            return known[1]
        key = spec_key(claim)
        cached = self.memo.plans.get(key)
        if cached is None:
            try:
                cached = prepare(claim, self.classes)
            except Rejected as rejected:
                cached = rejected
            if len(self.memo.plans) > 10_000:
                self.memo.plans.clear()
                self.memo.plans_cleared += 1
                self.reason_cache.clear()  # keyed by plan identity: a dropped plan's id may be reused
            self.memo.plans[key] = cached
        if len(self.memo.plan_of) > 100_000:
            self.memo.plan_of.clear()
        self.memo.plan_of[id(claim)] = (claim, cached)
        if isinstance(cached, Rejected):
            raise cached
        return cached

    def decide(self, claim: dra.ResourceClaim, only: DeviceFilter | None = None, *, explain: bool = True
               ) -> Decision:
        """Decide one claim against what is free now (among the devices `only` accepts); the caller
        take()s an allocation it keeps. `explain=False` skips the pending reason (a trial placement)."""
        self._only = only
        try:
            return self._decide(claim, explain)
        finally:
            self._only = None

    def _decide(self, claim: dra.ResourceClaim, explain: bool) -> Decision:
        try:
            plan = self.plan(claim)
            budget = [self.budget]
            for variant in plan.variants:
                found = self._place(plan, variant, budget)
                if found is not None:
                    return self._allocated(claim, plan, found)
        except Rejected as rejected:
            return Decision(State.REJECTED, reason=str(rejected))
        except BudgetExceeded:
            return Decision(State.PENDING, reason=(
                f"search budget of {self.budget} steps exhausted; the claim's constraints leave too many "
                "combinations on the free devices; simplify them or ask for fewer devices"))
        if not explain:
            return Decision(State.PENDING)
        try:
            reason, unsatisfiable = pending_reason(self, plan)
        except Rejected as rejected:
            return Decision(State.REJECTED, reason=str(rejected))
        return Decision(State.PENDING, reason=reason, unsatisfiable=unsatisfiable)

    def _allocated(self, claim: dra.ResourceClaim, plan: Plan, found: tuple[str, list[tuple[str, FleetDevice]]]
                   ) -> Decision:
        node, picked = found
        if len(picked) > dra.MAX_DEVICES_PER_CLAIM:
            return Decision(State.REJECTED, reason=(
                f"claim would get {len(picked)} devices, over the claim limit of {dra.MAX_DEVICES_PER_CLAIM}"))
        used_names = frozenset(name for name, _ in picked)
        key = (id(plan), used_names)
        known = self._configs.get(key)
        if known is None or known[0] is not plan:  # per spec and requests used: the same for every claim
            used = [a for _, alts in plan.requests for a in alts if a.result_name in used_names]
            known = self._configs[key] = (plan, frozenset(a.result_name for a in used if a.admin_access),
                                          _config_for(claim, self.classes, used))
        _, admin, config = known
        results = tuple(DeviceResult(name, d.driver, d.pool, d.name, name in admin) for name, d in picked)
        return Decision(State.ALLOCATED, Allocation(node, results, config))

    def _place(self, plan: Plan, variant: Sequence[Alternative], budget: list[int]
               ) -> tuple[str, list[tuple[str, FleetDevice]]] | None:
        grouping = plan.group_attribute(variant)
        if grouping is None or isinstance(grouping, str):
            return self._place_simple(variant[0], grouping, budget, plan)
        return self._place_searching(plan, variant, budget)

    def _place_simple(self, alternative: Alternative, attribute: str | None, budget: list[int], plan: Plan
                      ) -> tuple[str, list[tuple[str, FleetDevice]]] | None:
        """One ExactCount request, at most one matchAttribute: the best group with room is the answer,
        unless shared counters make its free devices exclude each other."""
        wanted = alternative.body.wanted
        for group in self.index(alternative, attribute).best_groups(wanted):
            budget[0] -= 1
            if budget[0] < 0:
                raise BudgetExceeded
            picked = self._pick(group, wanted, alternative, plan, budget)
            if picked is not None:
                return group.node, [(alternative.result_name, d) for d in picked]
        return None

    def _pick(self, group: Group, wanted: int, alternative: Alternative, plan: Plan, budget: list[int]
              ) -> list[FleetDevice] | None:
        left = self._counters.get(group.node)
        if left is None or not any(d.counter_draws for d in group.free):
            return group.free[:wanted]
        counters = NodeCounters(dict(left))
        candidates = self._partition_order(group.node, group.free, counters)
        found = search_node([alternative], {alternative.result_name: candidates},
                             Constraints(plan.constraints), counters, budget)
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

    def _place_searching(self, plan: Plan, variant: Sequence[Alternative], budget: list[int]
                         ) -> tuple[str, list[tuple[str, FleetDevice]]] | None:
        """The general case: several requests, All mode, adminAccess or distinctAttribute. Nodes come in
        the first request's preference order; each node is searched on its own."""
        indexes = [self.index(a) for a in variant]
        lead = next((i for i, a in enumerate(variant) if not a.admin_access), None)
        if lead is None:
            nodes: Iterable[str] = sorted(set.intersection(*(set(ix.node_names()) for ix in indexes)))
        else:
            nodes = (g.node for g in indexes[lead].best_groups(variant[lead].wanted))
        constraints = Constraints(plan.constraints)
        for node in nodes:
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
                found = search_node(variant, candidates, constraints, counters, budget)
                if found is not None:
                    return node, found
        return None


def decide(
    claim: dra.ResourceClaim,
    fleet: Fleet,
    classes: Mapping[str, dra.DeviceClass],
    in_use: Iterable[DeviceKey],
    *,
    memo: SelectorMemo | None = None,
    budget: int = DEFAULT_SEARCH_BUDGET,
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
    state = FleetState(fleet, classes, in_use, memo=memo, unusable_nodes=unusable_nodes)
    outcomes = []
    for claim in claims:
        decision = state.decide(claim)
        if decision.allocation is not None:
            state.take(decision.allocation)
        outcomes.append(Outcome(claim, decision))
    return outcomes
