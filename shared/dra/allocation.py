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

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from functools import cached_property
from typing import Any

from shared.dra import model as dra
from shared.dra.cel import CompiledSelector, SelectorError, compile_selector
from shared.dra.fleet_index import IN_USE, DeviceIndex, Group
from shared.dra.inventory import UNHEALTHY, CounterKey, Fleet, FleetDevice
from shared.dra.matching import SelectorMemo
from shared.dra.quantity import exact
from shared.dra.reasons import pending_reason

DeviceKey = tuple[str, str, str]
Amount = int | Fraction
DEFAULT_SEARCH_BUDGET = 20_000
MAX_VARIANTS = 256  # firstAvailable combinations tried across nodes, in order

__all__ = ["Allocation", "Decision", "DeviceResult", "FleetState", "Outcome", "SelectorMemo", "State", "decide",
           "settle"]


class State(StrEnum):
    PENDING = "Pending"
    ALLOCATED = "Allocated"
    REJECTED = "Rejected"
    PREEMPTED = "Preempted"
    RELEASED = "Released"


@dataclass(frozen=True)
class DeviceResult:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False  # monitoring access: the device stays free for others

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request": self.request, "driver": self.driver, "pool": self.pool,
                               "device": self.device}
        if self.admin_access:
            out["adminAccess"] = True
        return out


@dataclass(frozen=True)
class Allocation:
    node: str
    results: tuple[DeviceResult, ...]
    config: tuple[Mapping[str, Any], ...] = ()

    @cached_property
    def keys(self) -> tuple[DeviceKey, ...]:
        """Devices this allocation holds exclusively (admin-access results hold nothing)."""
        return tuple(r.key for r in self.results if not r.admin_access)

    def to_json(self) -> dict[str, Any]:
        """Mirrors ResourceClaim.status.allocation, plus nodeName for convenience."""
        return {
            "nodeName": self.node,
            "devices": {"results": [r.to_json() for r in self.results], "config": [dict(c) for c in self.config]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [self.node]}]}
                ]
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Allocation:
        return cls(
            node=data["nodeName"],
            results=tuple(
                DeviceResult(r["request"], r["driver"], r["pool"], r["device"], bool(r.get("adminAccess")))
                for r in data["devices"]["results"]
            ),
            config=tuple(data["devices"].get("config", ())),
        )


@dataclass(frozen=True)
class Decision:
    state: State
    allocation: Allocation | None = None
    reason: str | None = None
    unsatisfiable: bool = False  # Pending, and no device of today's fleet could ever satisfy it


class Rejected(Exception):
    """The claim is wrong as written; carries the reason."""


@dataclass(frozen=True)
class DeviceFilter:
    """Restricts one decision to some devices (quota tiers: flavors within nominal first). `key` names
    the restriction for the index cache; `accepts` must depend only on what a device is, not on which."""

    key: Any
    accepts: Callable[[FleetDevice], bool]


class _BudgetExceeded(Exception):
    pass


@dataclass(frozen=True)
class Alternative:
    """One way to satisfy a request: the request itself, or one firstAvailable subrequest."""

    result_name: str
    parent: str
    class_name: str
    body: dra.ExactDeviceRequest | dra.DeviceSubRequest
    selectors: tuple[CompiledSelector, ...]
    admin_access: bool

    @property
    def all_mode(self) -> bool:
        return self.body.allocation_mode == "All"

    @property
    def wanted(self) -> int:
        """Devices needed at least (All mode: one, and then every match on the node)."""
        return 1 if self.all_mode else self.body.wanted

    @cached_property
    def _selector_key(self) -> tuple[Any, ...]:
        return (tuple(s.expression for s in self.selectors), self.body.tolerations)

    def index_key(self, group_attribute: str | None = None) -> tuple[Any, ...]:
        return (*self._selector_key, group_attribute)


@dataclass(frozen=True)
class Plan:
    """A claim made ready to decide: compiled selectors per alternative, its constraints, and the
    concrete variants (one alternative per request) in the order firstAvailable prefers them."""

    requests: tuple[tuple[str, tuple[Alternative, ...]], ...]
    constraints: tuple[dra.DeviceConstraint, ...]
    variants: tuple[tuple[Alternative, ...], ...]
    more_variants: bool  # firstAvailable allowed more combinations than MAX_VARIANTS

    @cached_property
    def admin_access(self) -> bool:
        """Some request asks for monitoring access to devices that others may hold."""
        return any(a.admin_access for _, alternatives in self.requests for a in alternatives)

    def group_attribute(self, variant: Sequence[Alternative]) -> str | None | bool:
        """For a single-request variant, the one matchAttribute to group by (None: no constraint); False
        when the variant needs the general search."""
        if len(variant) != 1 or variant[0].admin_access or variant[0].all_mode:
            return False
        name = variant[0].result_name
        attribute: str | None = None
        for c in self.constraints:
            if c.requests and name not in c.requests and name.split("/", 1)[0] not in c.requests:
                continue
            if c.distinct_attribute is not None or attribute is not None:
                return False
            attribute = c.match_attribute
        return attribute


def prepare(claim: dra.ResourceClaim, classes: Mapping[str, dra.DeviceClass]) -> Plan:
    """Compile and check a claim once; raises Rejected with the reason a person can act on."""
    requests = claim.spec.devices.requests
    if not requests:
        raise Rejected("claim has no device requests")
    if len(requests) > dra.MAX_REQUESTS:
        raise Rejected(f"claim has {len(requests)} requests, over the limit of {dra.MAX_REQUESTS}")
    prepared: list[tuple[str, tuple[Alternative, ...]]] = []
    minimum_devices = 0
    for request in requests:
        bodies: list[tuple[str, dra.ExactDeviceRequest | dra.DeviceSubRequest, bool]]
        if request.exactly is not None:
            bodies = [(request.name, request.exactly, bool(request.exactly.admin_access))]
        else:
            bodies = [(f"{request.name}/{sub.name}", sub, False) for sub in request.first_available or ()]
        alternatives = []
        for result_name, body, admin in bodies:
            device_class = classes.get(body.device_class_name)
            if device_class is None:
                raise Rejected(
                    f"request {result_name!r}: unknown device class {body.device_class_name!r}; "
                    f"known classes: {', '.join(sorted(classes))}"
                )
            selectors = []
            for origin, selector in [("class", s) for s in device_class.spec.selectors] + [
                ("request", s) for s in body.selectors
            ]:
                try:
                    selectors.append(compile_selector(selector.cel.expression))
                except SelectorError as error:
                    raise Rejected(f"request {result_name!r}: {origin} selector: {error}") from None
            alternatives.append(
                Alternative(result_name, request.name, body.device_class_name, body, tuple(selectors), admin)
            )
        first = alternatives[0]
        minimum_devices += first.wanted
        if all(not a.all_mode and a.body.wanted > dra.MAX_DEVICES_PER_CLAIM for a in alternatives):
            raise Rejected(
                f"request {request.name!r} asks for {first.body.wanted} devices, over the claim limit of "
                f"{dra.MAX_DEVICES_PER_CLAIM}"
            )
        prepared.append((request.name, tuple(alternatives)))
    if minimum_devices > dra.MAX_DEVICES_PER_CLAIM:
        raise Rejected(
            f"claim asks for at least {minimum_devices} devices, over the claim limit of {dra.MAX_DEVICES_PER_CLAIM}"
        )
    names = {name for name, _ in prepared} | {a.result_name for _, alts in prepared for a in alts}
    for constraint in claim.spec.devices.constraints:
        unknown = [r for r in constraint.requests if r not in names]
        if unknown:
            raise Rejected(f"constraint names request {unknown[0]!r}, which the claim does not have")
    variants = tuple(itertools.islice(itertools.product(*(alts for _, alts in prepared)), MAX_VARIANTS + 1))
    return Plan(tuple(prepared), claim.spec.devices.constraints, variants[:MAX_VARIANTS],
                len(variants) > MAX_VARIANTS)


class _Constraints:
    """Incremental check of a claim's constraints over the devices picked so far."""

    def __init__(self, constraints: Sequence[dra.DeviceConstraint]) -> None:
        self.constraints = constraints

    @staticmethod
    def _applies(constraint: dra.DeviceConstraint, result_name: str) -> bool:
        if not constraint.requests:
            return True
        parent = result_name.split("/", 1)[0]
        return result_name in constraint.requests or parent in constraint.requests

    def admits(self, chosen: Sequence[tuple[str, FleetDevice]], result_name: str, device: FleetDevice) -> bool:
        for constraint in self.constraints:
            if not self._applies(constraint, result_name):
                continue
            attribute = constraint.match_attribute or constraint.distinct_attribute or ""
            value = device.attribute_text(attribute)
            if value is None:
                return False
            others = [d.attribute_text(attribute) for name, d in chosen if self._applies(constraint, name)]
            if constraint.match_attribute and others and others[0] != value:
                return False
            if constraint.distinct_attribute and value in others:
                return False
        return True


def counters_fit(left: Mapping[CounterKey, Amount], device: FleetDevice) -> bool:
    """Every counter the device draws on has enough left (an unknown counter has none)."""
    return all(left.get(key, -1) >= amount for key, amount in device.counter_draws)


class _NodeCounters:
    """Shared counters left on one node during a search: take and give back as devices are tried."""

    def __init__(self, left: dict[CounterKey, Amount]) -> None:
        self.left = left

    def fits(self, device: FleetDevice) -> bool:
        return counters_fit(self.left, device)

    def take(self, device: FleetDevice) -> None:
        for key, amount in device.counter_draws:
            self.left[key] = self.left.get(key, 0) - amount

    def give_back(self, device: FleetDevice) -> None:
        for key, amount in device.counter_draws:
            self.left[key] = self.left.get(key, 0) + amount


def _search_node(
    variant: Sequence[Alternative],
    candidates: Mapping[str, list[FleetDevice]],
    constraints: _Constraints,
    counters: _NodeCounters,
    budget: list[int],
) -> list[tuple[str, FleetDevice]] | None:
    """Depth-first over the variant's requests on one node; combinations within a request, never
    permutations; a request with fewer candidates than it needs is pruned before trying anything."""
    chosen: list[tuple[str, FleetDevice]] = []
    taken: set[DeviceKey] = set()

    def step() -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise _BudgetExceeded

    def pick(index: int) -> bool:
        if index == len(variant):
            return True
        alternative = variant[index]
        pool = [d for d in candidates[alternative.result_name] if d.key not in taken]
        if alternative.all_mode:
            return choose_all(alternative, pool, index)
        if len(pool) < alternative.body.wanted:
            return False
        return choose(alternative, pool, 0, alternative.body.wanted, index)

    def add(name: str, device: FleetDevice) -> None:
        chosen.append((name, device))
        taken.add(device.key)
        counters.take(device)

    def remove() -> None:
        _, device = chosen.pop()
        taken.discard(device.key)
        counters.give_back(device)

    def choose_all(alternative: Alternative, pool: list[FleetDevice], index: int) -> bool:
        mark = len(chosen)
        for device in pool:
            step()
            if not (counters.fits(device) and constraints.admits(chosen, alternative.result_name, device)):
                break
            add(alternative.result_name, device)
        else:
            if pick(index + 1):
                return True
        while len(chosen) > mark:
            remove()
        return False

    def choose(alternative: Alternative, pool: list[FleetDevice], start: int, remaining: int, index: int) -> bool:
        if remaining == 0:
            return pick(index + 1)
        for i in range(start, len(pool) - remaining + 1):
            step()
            device = pool[i]
            if not counters.fits(device) or not constraints.admits(chosen, alternative.result_name, device):
                continue
            add(alternative.result_name, device)
            if choose(alternative, pool, i + 1, remaining - 1, index):
                return True
            remove()
        return False

    return list(chosen) if pick(0) else None


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


def _spec_key(claim: dra.ResourceClaim) -> str:
    """The spec as JSON: equal specs serialise alike, and pydantic-core writes it in compiled code, several
    times faster than hashing and comparing the nested models field by field in Python (and it also
    covers opaque parameters, which hold unhashable dicts)."""
    return claim.spec.model_dump_json()


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
        key = _spec_key(claim)
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
        except _BudgetExceeded:
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
                raise _BudgetExceeded
            picked = self._pick(group, wanted, alternative, plan, budget)
            if picked is not None:
                return group.node, [(alternative.result_name, d) for d in picked]
        return None

    def _pick(self, group: Group, wanted: int, alternative: Alternative, plan: Plan, budget: list[int]
              ) -> list[FleetDevice] | None:
        left = self._counters.get(group.node)
        if left is None or not any(d.counter_draws for d in group.free):
            return group.free[:wanted]
        counters = _NodeCounters(dict(left))
        candidates = self._partition_order(group.node, group.free, counters)
        found = _search_node([alternative], {alternative.result_name: candidates},
                             _Constraints(plan.constraints), counters, budget)
        return [d for _, d in found] if found is not None else None

    def _partition_order(self, node: str, free: list[FleetDevice], counters: _NodeCounters) -> list[FleetDevice]:
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
        constraints = _Constraints(plan.constraints)
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
                counters = _NodeCounters(dict(self._counters.get(node, {})))
                found = _search_node(variant, candidates, constraints, counters, budget)
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


@dataclass(frozen=True)
class Outcome:
    claim: dra.ResourceClaim
    decision: Decision


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
