"""The start estimates' extrapolation (issue 39): a forward run through the core (shared/admission/
forward_run.py) admits its first `exact` claims (estimates.EXACT_ADMISSIONS); the claims still waiting after
them are placed here, node by node: as devices free on a node (the running claims' ends, then the extrapolated
claims' own), the claim first in `turns` (the tenants in turn, each tenant's claims by priority and arrival)
of those whose spec fits a free node of that shape and whose size the node's free devices hold starts there.
Quotas, fair share and preemption are not looked at, nor what a claim's constraints ask beyond its node's
shape. A core admission costs about what it costs the allocator, and an instant's cycle some 30-80 ms on a
full fleet of 1,000 nodes (most of it the preemption search), so running all 10,000 through the core costs
seconds; `make bench-eta` measures the whole (docs/performance.md). A complete gang's members are placed one
by one; the gang then starts when its last member does (estimates.py).

What each spec could ever have of the fleet (`Fits`) is what it places claims by, and says which claims no
run could start at all (no device of today's fleet could ever satisfy them, or they are Rejected as written).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.admission.forward_run import ForwardRun, Start
from shared.admission.model import ClaimKey, Snapshot, Waiting
from shared.admission.runtimes import Quantiles
from shared.dra.allocation import FleetState
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo
from shared.dra.results import Rejected, State

UNSATISFIABLE = "no device of today's fleet could ever satisfy it"
REJECTED = "it is Rejected as written: it will never start"


def extrapolate(run: ForwardRun, turns: Sequence[Waiting], fits: Fits,
                flat: Mapping[ClaimKey, Quantiles | None]) -> None:
    """The claims still waiting once `run` admitted its `exact`: see the module's docstring. Node by node, as
    devices free there (the running claims' ends, then the extrapolated claims' own), the claim first in
    `turns` of those whose spec fits that node's shape and whose size its free devices hold starts there, and
    runs its `flat` runtime (its tenant's where no flavor is known)."""
    if len(run.started) < run.exact:
        return
    fleet, waiting, hopeless, p90 = run.fleet, run.waiting, run.hopeless, run.quantile == 1
    held: dict[str, int] = {}
    for r in run.running.values():
        held[r.allocation.node] = held.get(r.allocation.node, 0) + len(r.allocation.keys)
    free = {n: len(inventory.devices) - held.get(n, 0) for n, inventory in fleet.nodes.items()
            if n not in run.unusable_nodes}
    # per spec, its claims still waiting in turn order: (turn, claim, size, seconds it runs)
    queues: dict[int, deque[tuple[int, Waiting, int, float | None]]] = {}
    for turn, w in enumerate(turns):
        key = w.key
        if key in waiting and key not in hopeless and (spec := fits.spec.get(key)) is not None:
            runtime = flat.get(key)
            seconds = None if runtime is None else runtime.p90 if p90 else runtime.p50
            queues.setdefault(spec, deque()).append((turn, w, run.sizes[key], seconds))
    by_shape: dict[int, list[deque[tuple[int, Waiting, int, float | None]]]] = {}
    for spec, queue in queues.items():
        for shape in fits.shapes.get(spec, ()):
            by_shape.setdefault(shape, []).append(queue)
    # (when, node, devices freed, by whom): the running claims' ends, and now on each node with room
    events = [(end, r.allocation.node, len(r.allocation.keys), f"{r.tenant}/{r.name}")
              for end, _, _, r in run.ends if run.running.get(r.key) is r]
    events += [(run.now, n, 0, "") for n, room in free.items() if room > 0]
    heapq.heapify(events)
    while events:
        at, node, count, name = heapq.heappop(events)
        if at > run.limit or node not in free:
            continue
        free[node] += count
        room = free[node]
        shape = fleet.nodes[node].shape_id
        candidates = by_shape.get(shape)
        while room > 0 and candidates:
            best, first = None, len(turns)
            for queue in candidates:
                if queue:
                    head = queue[0]
                    if head[2] <= room and head[0] < first:
                        best, first = queue, head[0]
            if best is None:
                break
            _, w, size, seconds = best.popleft()
            if not best:  # its spec has no claim left: no node looks at it again
                for listed in by_shape.values():
                    if best in listed:
                        listed.remove(best)
            room -= size
            run.started[w.key] = Start(max(at, run.now), (name,) if name else ())
            if seconds is not None:
                heapq.heappush(events, (max(at, run.now) + seconds, node, size, f"{w.tenant}/{w.name}"))
        free[node] = room


def turns(waiting: Iterable[Waiting]) -> list[Waiting]:
    """The waiting claims as the extrapolation hands out devices: the tenants in turn, each tenant's claims by
    priority, then arrival (a tenant whose claims the core started already has fewer turns left)."""
    by_tenant: dict[str, list[Waiting]] = {}
    for w in sorted(waiting, key=lambda w: (-w.priority, w.arrival, w.name)):
        by_tenant.setdefault(w.tenant, []).append(w)
    return [w for turn in itertools.zip_longest(*by_tenant.values()) for w in turn if w is not None]


def size_of(waiting: Waiting) -> int:
    """Devices a claim takes at least (its exact counts; 1 for an All or a firstAvailable request)."""
    total = 0
    for request in waiting.claim.spec.devices.requests:
        exactly = request.exactly
        total += exactly.count if exactly is not None and exactly.count else 1
    return total


@dataclass
class Fits:
    """What each waiting claim's spec could ever have of the fleet: `never` the claims that could not be placed
    even on the whole fleet free, and why (no device of today's fleet could ever satisfy them, or they are
    Rejected as written); per spec (`spec`: its plan's id) the node shapes on a free node of which it fits
    (`shapes`), what the extrapolation places claims by. One trial per spec and shape, kept in the memo while
    the fleet is the same."""

    never: dict[ClaimKey, str] = field(default_factory=dict)
    spec: dict[ClaimKey, int] = field(default_factory=dict)
    shapes: Mapping[int, frozenset[int]] = field(default_factory=dict)
    trials: Trials | None = None  # what the next call may keep (EstimateMemo.trials)

    @classmethod
    def of(cls, snapshot: Snapshot, selectors: SelectorMemo, trials: Trials | None) -> Fits:
        """With the trials of an earlier call (None: none), kept while the fleet is the same."""
        if trials is None or not trials.holds(snapshot, selectors):
            trials = Trials(snapshot, selectors)
        out = cls(shapes=trials.shapes, trials=trials)
        for w in snapshot.waiting:
            found = trials.of(w.claim)
            if found is None:
                out.never[w.key] = REJECTED
            elif (why := found[1]) is not None:
                out.never[w.key] = why
            else:
                out.spec[w.key] = found[0]
        return out


class Trials:
    """Per spec, whether it could be placed on the whole fleet free and on a free node of each shape."""

    def __init__(self, snapshot: Snapshot, memo: SelectorMemo) -> None:
        fleet, classes, unusable = snapshot.fleet, snapshot.classes, dict(snapshot.unusable_nodes)
        self.fleet, self.classes, self.unusable, self.cleared = fleet, classes, unusable, memo.plans_cleared
        self.whole = FleetState(fleet, classes, (), memo=memo, unusable_nodes=unusable)
        self.singles = {}  # per node shape, one free node of it (a usable one)
        for shape, names in fleet.nodes_by_shape.items():
            usable = next((n for n in names if n not in unusable), None)
            if usable is not None:
                self.singles[shape] = FleetState(Fleet({usable: fleet.nodes[usable]}), classes, (), memo=memo)
        self.never: dict[int, str | None] = {}
        self.shapes: dict[int, frozenset[int]] = {}

    def holds(self, snapshot: Snapshot, memo: SelectorMemo) -> bool:
        return (snapshot.fleet is self.fleet and snapshot.classes is self.classes
                and dict(snapshot.unusable_nodes) == self.unusable and memo.plans_cleared == self.cleared)

    def of(self, claim: Any) -> tuple[int, str | None] | None:
        """The claim's plan id and why it could never be placed (None: it could); None if it is Rejected."""
        try:
            plan = id(self.whole.plan(claim))
        except Rejected:
            return None
        if plan not in self.never:
            decision = self.whole.decide(claim, explain=True)
            why = self.never[plan] = (REJECTED if decision.state is State.REJECTED else
                                      UNSATISFIABLE if decision.unsatisfiable else None)
            if why is None:
                self.shapes[plan] = frozenset(shape for shape, single in self.singles.items()
                                              if single.decide(claim, explain=False).allocation is not None)
        return plan, self.never[plan]
