"""The pure allocation decision: which devices a ResourceClaim gets, or why it waits or is refused.

Semantics follow the Kubernetes structured allocator (resource.k8s.io/v1): class selectors before
request selectors, ExactCount and All, firstAvailable tried in order, matchAttribute and
distinctAttribute constraints, NoSchedule/NoExecute taints, 32 devices per claim. Where DRA is
first-fit we place best-fit: partly used nodes first (whole nodes stay free for big jobs), and the
smallest adequate device first. The search tries combinations, never permutations, and is bounded:
running out of budget is a reason, not a hang. No I/O happens here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

from shared import dra
from shared.cel import CompiledSelector, SelectorError, compile_selector, evaluate
from shared.inventory import CounterKey, Fleet, FleetDevice, NodeInventory
from shared.quantity import Quantity

DeviceKey = tuple[str, str, str]
DEFAULT_SEARCH_BUDGET = 20_000


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

    @property
    def keys(self) -> tuple[DeviceKey, ...]:
        """Devices this allocation holds exclusively (admin-access results hold nothing)."""
        return tuple((r.driver, r.pool, r.device) for r in self.results if not r.admin_access)

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


class _Rejected(Exception):
    """The claim is wrong as written; carries the reason."""


class _BudgetExceeded(Exception):
    pass


@dataclass(frozen=True)
class _Alternative:
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


@dataclass
class SelectorMemo:
    """Selector results per distinct tuple of the device values an expression reads.

    Kept across decisions by the caller; it holds only derived data, so it never changes an answer.
    """

    results: dict[tuple[str, Any], bool] = field(default_factory=dict)
    evaluations: int = 0
    # Devices a selector list accepts, per fleet snapshot (the fleet is immutable; a new one misses).
    matching: dict[tuple[str, ...], tuple[Fleet, list[FleetDevice]]] = field(default_factory=dict)

    def matches(self, selector: CompiledSelector, device: FleetDevice) -> bool:
        key = (selector.expression, _signature(selector, device))
        hit = self.results.get(key)
        if hit is None:
            self.evaluations += 1
            hit = evaluate(selector, device.activation)
            if len(self.results) > 200_000:
                self.results.clear()
            self.results[key] = hit
        return hit


def _signature(selector: CompiledSelector, device: FleetDevice) -> Any:
    if selector.names is None:
        return device.key
    names = selector.names
    return (
        device.driver,
        tuple(sorted((k, str(v)) for k, v in device.attributes.items() if k.rpartition("/")[2] in names)),
        tuple(sorted((k, v.value) for k, v in device.capacity.items() if k.rpartition("/")[2] in names)),
    )


def _tolerated(taint: dra.DeviceTaint, tolerations: Sequence[dra.Toleration]) -> bool:
    for t in tolerations:
        if t.effect not in (None, "") and t.effect != taint.effect:
            continue
        if t.operator == "Exists" and (t.key is None or t.key == taint.key):
            return True
        if t.operator == "Equal" and t.key == taint.key and (t.value or None) == (taint.value or None):
            return True
    return False


def _blocked_by_taint(device: FleetDevice, tolerations: Sequence[dra.Toleration]) -> bool:
    return any(
        t.effect in ("NoSchedule", "NoExecute") and not _tolerated(t, tolerations) for t in device.taints
    )


def _prepare(
    claim: dra.ResourceClaim, classes: Mapping[str, dra.DeviceClass]
) -> list[tuple[str, list[_Alternative]]]:
    requests = claim.spec.devices.requests
    if len(requests) > dra.MAX_REQUESTS:
        raise _Rejected(f"claim has {len(requests)} requests, over the limit of {dra.MAX_REQUESTS}")
    prepared: list[tuple[str, list[_Alternative]]] = []
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
                raise _Rejected(
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
                    raise _Rejected(f"request {result_name!r}: {origin} selector: {error}") from None
            alternatives.append(
                _Alternative(result_name, request.name, body.device_class_name, body, tuple(selectors), admin)
            )
        first = alternatives[0].body
        minimum_devices += 1 if first.allocation_mode == "All" else first.wanted
        if all(a.body.allocation_mode == "ExactCount" and a.body.wanted > dra.MAX_DEVICES_PER_CLAIM
               for a in alternatives):
            raise _Rejected(
                f"request {request.name!r} asks for {first.wanted} devices, over the claim limit of "
                f"{dra.MAX_DEVICES_PER_CLAIM}"
            )
        prepared.append((request.name, alternatives))
    if minimum_devices > dra.MAX_DEVICES_PER_CLAIM:
        raise _Rejected(
            f"claim asks for at least {minimum_devices} devices, over the claim limit of {dra.MAX_DEVICES_PER_CLAIM}"
        )
    return prepared


def _matching(alternative: _Alternative, fleet: Fleet, memo: SelectorMemo) -> list[FleetDevice]:
    """Devices the class and request selectors accept; stops at the first false, class first."""
    key = tuple(s.expression for s in alternative.selectors)
    cached = memo.matching.get(key)
    if cached is not None and cached[0] is fleet:
        return cached[1]
    out = []
    for device in fleet.devices:
        try:
            if all(memo.matches(s, device) for s in alternative.selectors):
                out.append(device)
        except SelectorError as error:
            raise _Rejected(
                f"request {alternative.result_name!r}: selector on device {device.driver}/{device.pool}/"
                f"{device.name}: {error}"
            ) from None
    if len(memo.matching) > 1024:
        memo.matching.clear()
    memo.matching[key] = (fleet, out)
    return out


def _best_fit_order(device: FleetDevice) -> tuple[Any, ...]:
    """Smallest adequate device first, so a 20 GB job does not take an H200."""
    memory = device.memory
    return (memory.value if memory is not None else 0, device.name)


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


class _Counters:
    """Shared counters left on a node: a full GPU and its MIG partitions draw on the same ones, so they
    exclude each other, and partitions never over-subscribe a GPU (DRA partitionable devices)."""

    def __init__(self, node: NodeInventory, in_use: frozenset[DeviceKey], fleet: Fleet) -> None:
        self.left: dict[CounterKey, Fraction] = {k: q.value for k, q in node.counters.items()}
        if not self.left:
            return  # no partitionable devices here: nothing to subtract
        for key in in_use:
            device = fleet.by_key.get(key)
            if device is not None and device.node == node.node:
                self.take(device)

    def _draws(self, device: FleetDevice) -> list[tuple[CounterKey, Fraction]]:
        return [((device.driver, device.pool, c.counter_set, name), Quantity(v.value).value)
                for c in device.consumes_counters for name, v in c.counters.items()]

    def fits(self, device: FleetDevice) -> bool:
        return all(key in self.left and self.left[key] >= amount for key, amount in self._draws(device))

    def take(self, device: FleetDevice) -> None:
        for key, amount in self._draws(device):
            self.left[key] = self.left.get(key, Fraction(0)) - amount

    def give_back(self, device: FleetDevice) -> None:
        for key, amount in self._draws(device):
            self.left[key] = self.left.get(key, Fraction(0)) + amount


def _search_node(
    prepared: Sequence[tuple[str, list[_Alternative]]],
    candidates: Mapping[str, list[FleetDevice]],
    all_mode_blocked: set[str],
    constraints: _Constraints,
    counters: _Counters,
    budget: list[int],
) -> list[tuple[str, FleetDevice]] | None:
    chosen: list[tuple[str, FleetDevice]] = []
    taken: set[DeviceKey] = set()

    def pick(request_index: int) -> bool:
        if request_index == len(prepared):
            return True
        for alternative in prepared[request_index][1]:
            if alternative.result_name in all_mode_blocked:
                continue
            pool = [d for d in candidates.get(alternative.result_name, ()) if d.key not in taken]
            if alternative.all_mode:
                if not pool or len(pool) != len(candidates.get(alternative.result_name, ())):
                    continue
                if choose_all(alternative, pool) and pick(request_index + 1):
                    return True
                continue
            if len(pool) < alternative.body.wanted:
                continue  # prune by counts before trying anything
            if choose(alternative, pool, 0, alternative.body.wanted, request_index):
                return True
        return False

    def choose_all(alternative: _Alternative, pool: list[FleetDevice]) -> bool:
        mark = len(chosen)
        for device in pool:
            if not (counters.fits(device) and constraints.admits(chosen, alternative.result_name, device)):
                for _, d in chosen[mark:]:
                    taken.discard(d.key)
                    counters.give_back(d)
                del chosen[mark:]
                return False
            chosen.append((alternative.result_name, device))
            taken.add(device.key)
            counters.take(device)
        return True

    def choose(alternative: _Alternative, pool: list[FleetDevice], start: int, remaining: int, index: int) -> bool:
        if remaining == 0:
            return pick(index + 1)
        for i in range(start, len(pool) - remaining + 1):  # combinations, not permutations
            budget[0] -= 1
            if budget[0] < 0:
                raise _BudgetExceeded
            device = pool[i]
            if device.key in taken or not counters.fits(device):
                continue
            if not constraints.admits(chosen, alternative.result_name, device):
                continue
            chosen.append((alternative.result_name, device))
            taken.add(device.key)
            counters.take(device)
            if choose(alternative, pool, i + 1, remaining - 1, index):
                return True
            chosen.pop()
            taken.discard(device.key)
            counters.give_back(device)
        return False

    return list(chosen) if pick(0) else None


def _config_for(
    claim: dra.ResourceClaim, classes: Mapping[str, dra.DeviceClass], used: Sequence[_Alternative]
) -> tuple[dict[str, Any], ...]:
    """Class configs first (FromClass), then the claim's own (FromClaim), as DRA writes them."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for alternative in used:
        if alternative.class_name in seen:
            continue
        seen.add(alternative.class_name)
        names = [a.result_name for a in used if a.class_name == alternative.class_name]
        for config in classes[alternative.class_name].spec.config:
            out.append({"source": "FromClass", "requests": names,
                        "opaque": config.opaque.model_dump(by_alias=True, exclude_none=True)})
    for claim_config in claim.spec.devices.config:
        out.append({"source": "FromClaim", "requests": list(claim_config.requests),
                    "opaque": claim_config.opaque.model_dump(by_alias=True, exclude_none=True)})
    return tuple(out)


_EQUALITY = re.compile(r"""attributes\[\s*["']([^"']+)["']\s*\]\s*\.\s*([A-Za-z_][\w-]*)\s*==\s*["']([^"']*)["']""")


def _closest(alternative: _Alternative, fleet: Fleet) -> str:
    """For a memory ask no device meets (200 Gi), name the biggest device of the class: the closest one."""
    if not any("memory" in s.expression for s in alternative.selectors):
        return ""
    sized = [d for d in fleet.devices if d.memory is not None and d.driver == "gpu.nvidia.com"]
    if not sized:
        return ""
    biggest = max(sized, key=lambda d: (d.memory.value if d.memory else 0, d.key))
    product = biggest.attribute_text(f"{biggest.driver}/productName") or biggest.name
    memory = biggest.memory.humanize() if biggest.memory else "?"
    return f" The closest device is {biggest.node}/{biggest.name} ({product}, {memory} of memory)."


def _did_you_mean(alternative: _Alternative, fleet: Fleet) -> str:
    """For `productName == "H100"` against a fleet that says "NVIDIA H100 80GB HBM3", show what exists."""
    hints = []
    for selector in alternative.selectors[1:] if alternative.selectors else ():
        for domain, name, wanted in _EQUALITY.findall(selector.expression):
            values = sorted({v for d in fleet.devices if (v := d.attribute_text(f"{domain}/{name}")) is not None})
            if values and wanted not in values:
                close = [v for v in values if wanted.lower() in v.lower()]
                listed = ", ".join(repr(v) for v in (close or values)[:6])
                hints.append(f"{domain}/{name} is never {wanted!r} in the fleet; did you mean {listed}?")
    return (" " + " ".join(hints)) if hints else ""


def _pending_reason(
    prepared: Sequence[tuple[str, list[_Alternative]]],
    matching: Mapping[str, list[FleetDevice]],
    in_use: frozenset[DeviceKey],
    fleet: Fleet,
    classes: Mapping[str, dra.DeviceClass],
) -> str:
    parts = []
    for _, alternatives in prepared:
        for alternative in alternatives:
            devices = matching[alternative.result_name]
            free = [d for d in devices if d.key not in in_use]
            nodes = len({d.node for d in devices})
            wanted = "all" if alternative.all_mode else str(alternative.body.wanted)
            resource = classes[alternative.class_name].spec.extended_resource_name
            label = f"Insufficient {resource}" if resource else f"Insufficient {alternative.class_name} devices"
            head = f"{label}: requested {wanted}" + (
                f" for request {alternative.result_name!r}" if len(prepared) > 1 or len(alternatives) > 1 else ""
            )
            if not devices:
                parts.append(
                    f"{head}, but no device in the fleet ({len(fleet.devices)} devices on {len(fleet.nodes)} "
                    f"node{'s' if len(fleet.nodes) != 1 else ''}) matches its selectors; it waits until one "
                    f"appears.{_did_you_mean(alternative, fleet)}{_closest(alternative, fleet)}"
                )
                continue
            per_node_free: dict[str, int] = {}
            for d in free:
                per_node_free[d.node] = per_node_free.get(d.node, 0) + 1
            most = max(per_node_free.values(), default=0)
            text = f"{head}, free {len(free)} of {len(devices)} on {nodes} node{'s' if nodes != 1 else ''}"
            if not alternative.all_mode and len(free) >= alternative.body.wanted > most:
                text += f"; at most {most} free on any one node"
            elif not alternative.all_mode and most >= alternative.body.wanted:
                text += "; enough free devices exist but the claim's constraints cannot be met together"
            parts.append(text)
    return "; ".join(parts) if parts else "no requests"


def decide(
    claim: dra.ResourceClaim,
    fleet: Fleet,
    classes: Mapping[str, dra.DeviceClass],
    in_use: frozenset[DeviceKey],
    *,
    memo: SelectorMemo | None = None,
    node_usage: Mapping[str, int] | None = None,
    budget: int = DEFAULT_SEARCH_BUDGET,
) -> Decision:
    """Decide one claim against the fleet; `in_use` holds devices other claims already have."""
    memo = memo or SelectorMemo()
    try:
        prepared = _prepare(claim, classes)
        if not prepared:
            return Decision(State.REJECTED, reason="claim has no device requests")
        matching = {a.result_name: _matching(a, fleet, memo) for _, alts in prepared for a in alts}
    except _Rejected as rejected:
        return Decision(State.REJECTED, reason=str(rejected))
    constraints = _Constraints(claim.spec.devices.constraints)
    usage = node_usage or {}
    by_node: dict[str, dict[str, list[FleetDevice]]] = {}
    for _, alternatives in prepared:
        for a in alternatives:
            for d in matching[a.result_name]:
                by_node.setdefault(d.node, {}).setdefault(a.result_name, []).append(d)

    def node_candidates(node: str) -> tuple[dict[str, list[FleetDevice]], set[str]] | None:
        """Free, untainted matching devices per request alternative, best fit first; None if one lacks any."""
        candidates: dict[str, list[FleetDevice]] = {}
        all_blocked: set[str] = set()
        for _, alternatives in prepared:
            for a in alternatives:
                here = by_node[node].get(a.result_name, [])
                if a.all_mode and not a.admin_access and any(d.key in in_use for d in here):
                    all_blocked.add(a.result_name)
                candidates[a.result_name] = sorted(
                    (
                        d
                        for d in here
                        if (a.admin_access or d.key not in in_use)
                        and not _blocked_by_taint(d, a.body.tolerations)
                    ),
                    key=_best_fit_order,
                )
        if all(any(candidates[a.result_name] for a in alternatives) for _, alternatives in prepared):
            return candidates, all_blocked
        return None

    def node_order(node: str) -> tuple[Any, ...]:
        # Partly used nodes first, so whole nodes stay free for big jobs; then the node whose smallest
        # free matching device is smallest (best fit); then by name, deterministically. Candidates are
        # built only for the nodes actually tried, in this order.
        free = (_best_fit_order(d)[0] for ds in by_node[node].values() for d in ds if d.key not in in_use)
        return (-usage.get(node, 0), min(free, default=0), node)

    nodes = sorted(by_node, key=node_order)
    budget_left = [budget]
    for node in nodes:
        built = node_candidates(node)
        if built is None:
            continue
        candidates, all_blocked = built
        try:
            counters = _Counters(fleet.nodes[node], in_use, fleet)
            found = _search_node(prepared, candidates, all_blocked, constraints, counters, budget_left)
        except _BudgetExceeded:
            return Decision(
                State.PENDING,
                reason=f"search budget of {budget} steps exhausted after {len(nodes)} node(s); the claim's "
                "constraints leave too many combinations; simplify them or ask for fewer devices",
            )
        if found is not None:
            if len(found) > dra.MAX_DEVICES_PER_CLAIM:
                return Decision(
                    State.REJECTED,
                    reason=f"claim would get {len(found)} devices, over the claim limit of {dra.MAX_DEVICES_PER_CLAIM}",
                )
            used_names = {name for name, _ in found}
            used = [a for _, alts in prepared for a in alts if a.result_name in used_names]
            admin = {a.result_name for a in used if a.admin_access}
            results = tuple(DeviceResult(name, d.driver, d.pool, d.name, name in admin) for name, d in found)
            return Decision(State.ALLOCATED, Allocation(node, results, _config_for(claim, classes, used)))
    return Decision(State.PENDING, reason=_pending_reason(prepared, matching, in_use, fleet, classes))


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
) -> list[Outcome]:
    """Decide claims in the given (arrival) order; each allocation is seen by the claims after it."""
    memo = memo or SelectorMemo()
    taken = set(in_use)
    usage: dict[str, int] = {}
    by_key = {d.key: d for d in fleet.devices}
    for key in taken:
        if key in by_key:
            usage[by_key[key].node] = usage.get(by_key[key].node, 0) + 1
    outcomes = []
    for claim in claims:
        decision = decide(claim, fleet, classes, frozenset(taken), memo=memo, node_usage=usage)
        if decision.allocation is not None:
            taken.update(decision.allocation.keys)
            usage[decision.allocation.node] = usage.get(decision.allocation.node, 0) + len(decision.allocation.keys)
        outcomes.append(Outcome(claim, decision))
    return outcomes
