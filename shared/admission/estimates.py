"""Start estimates (issue 39): when the broker expects each waiting claim to be allocated, as p50 and p90, from
the same decision core run forward on a clock of its own. Pure: time is the snapshot's `now`.

Two forward runs from the snapshot: in one every running claim ends at its allocation time plus its p50
runtime (never before now) and every claim admitted meanwhile runs its p50; in the other the same with p90.
A claim's p50 and p90 are the instants it is admitted in each run (the earlier of the two is its p50).
Runtimes (`Runtimes`): a claim's claimbroker.io/expected-runtime, else its tenant's observed runtimes on the
flavor it holds, else its tenant's, else a default; a running claim with none of them never ends within the
run. At each instant at which claims end or a time rule lets go (minRuntime ends, a preemption leaves the
minute maxPreemptionsPerMinute counts, a gang's wait is over) one cycle of the core runs, as the allocator's
next cycle would (fair share, quotas, priority, preemption and its limits, gangs), on one KeptState carried
from instant to instant.

Approximations, each cheaper than what it stands for:
- Ends close together are one instant: the ends within max(60 s, 2 % of the time ahead) of the first one are
  taken together at the last of them, so a far future costs a few hundred instants, not one per claim (an
  estimate is never early for it, and late by at most that window).
- One cycle per instant, not cycles until nothing changes: what a cycle leaves (a preemptor past the
  cycle's preemption attempts) waits for the next instant.
- A claim preempted in a forward run leaves it (a running claim carries no claim document to queue it again):
  victims are not estimated a second start.
- A running claim allocated at an unknown time (allocated_at None) is taken as allocated now.
- Only waiting claims are estimated; claims that arrive later (and may come ahead of them) are not foreseen.
- A gang whose members have not all arrived waits for them: its members get no estimate, and say so. The
  extrapolation places a complete gang's members one by one; the gang then starts when its last member does.
- Beyond the first `exact` admissions of a run (EXACT_ADMISSIONS) the claims left are extrapolated
  (`_Forward.extrapolate`), node by node: as devices free on a node (the running claims' ends, then the
  extrapolated claims' own), the claim first in `turns` (the tenants in turn, each tenant's claims by priority
  and arrival) of those whose spec fits a free node of that shape and whose size the node's free devices hold
  starts there. Quotas, fair share and preemption are not looked at, nor what a claim's constraints ask beyond
  its node's shape. A core admission costs about what it costs the allocator, and an instant's cycle some
  30-80 ms on a full fleet of 1,000 nodes (most of it the preemption search), so running all 10,000 through
  the core costs seconds; `make bench-eta` measures the whole (docs/performance.md).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from statistics import NormalDist
from typing import Any

from shared.admission.cycle import run_cycle
from shared.admission.flavors import Flavors, FleetFlavors
from shared.admission.holdings import allocated_devices
from shared.admission.kept import KeptState
from shared.admission.model import ClaimKey, CycleResult, Running, Snapshot, Waiting
from shared.admission.settling import MAX_GOING_ON
from shared.admission.sim_clock import ClockedQueue
from shared.admission.waiting_queue import WaitingQueue
from shared.contract.gang_reasons import incomplete_reason
from shared.dra.allocation import FleetState
from shared.dra.claims import InvalidClaim, expected_runtime, gang_name, gang_of
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo
from shared.dra.results import Allocation, DeviceKey, Rejected, State

HORIZON = 7 * 86400.0  # how far ahead the forward runs look
MAX_NAMED = 4  # claims named in blocked_by, then "and N more"
BATCH_SECONDS = 60.0  # ends within this of each other (or a fiftieth of the time ahead) are one instant
BATCH_FRACTION = 0.02
MAX_INSTANTS = 2000  # per forward run: then the claims left get no estimate
EXACT_ADMISSIONS = 300  # per forward run, admitted by the core; the claims after them are extrapolated
UNSATISFIABLE = "no device of today's fleet could ever satisfy it"
REJECTED = "it is Rejected as written: it will never start"


@dataclass(frozen=True)
class Quantiles:
    """Runtimes in seconds."""

    p50: float
    p90: float

    def end(self, since: float, now: float, *, upper: bool) -> float:
        """When a claim allocated at `since` and still running at `now` ends, in the p50 run (or the p90 run,
        `upper`): the median (p90) of its runtime given that it has run this long, taking runtimes as a
        lognormal through p50 and p90. Unconditioned, a claim past the tenant's observed p50 would end at
        once and every estimate behind it say 'now' (bench/bench_eta_accuracy.py measured the error as large
        as the waits). One runtime (an expected-runtime annotation, p50 == p90) is taken as it is: at its end,
        never before now."""
        seconds = self.p90 if upper else self.p50
        elapsed = now - since
        if elapsed <= 0 or not 0 < self.p50 < self.p90:
            return max(now, since + seconds)
        mu = math.log(self.p50)
        sigma = (math.log(self.p90) - mu) / _Z90
        done = _NORMAL.cdf((math.log(elapsed) - mu) / sigma)  # of such runs, the share over by now
        target = min(done + (0.9 if upper else 0.5) * (1.0 - done), _MOST)
        return max(now, since + math.exp(mu + sigma * _NORMAL.inv_cdf(target)))


_NORMAL = NormalDist()
_Z90 = _NORMAL.inv_cdf(0.9)
_MOST = 1.0 - 1e-9  # a quantile short of 1: inv_cdf(1) is infinite


@dataclass(frozen=True)
class Runtimes:
    """How long claims run once Allocated, where their claimbroker.io/expected-runtime does not say: observed
    quantiles per (tenant, flavor) and per tenant (the shell works them out of the ledger's history), else
    `default` (None: unknown, and a running claim of unknown runtime never ends within the estimate)."""

    by_flavor: Mapping[tuple[str, str], Quantiles] = field(default_factory=dict)
    by_tenant: Mapping[str, Quantiles] = field(default_factory=dict)
    default: Quantiles | None = None

    def of(self, tenant: str, flavors: Iterable[str | None], expected: float | None) -> Quantiles | None:
        """A claim's runtime: its expected runtime, else what its tenant's claims ran on a flavor it holds
        (the longest of those known), else what its tenant's ran, else the default."""
        if expected is not None:
            return Quantiles(expected, expected)
        if self.by_flavor:
            known = [q for f in flavors if f is not None and (q := self.by_flavor.get((tenant, f))) is not None]
            if known:
                return max(known, key=lambda q: (q.p50, q.p90))
        return self.by_tenant.get(tenant, self.default)


@dataclass(frozen=True)
class Estimate:
    """When a waiting claim is expected to be allocated (seconds since the epoch), and what it waits for; p50
    None when nothing can be said (`reason` says why), p90 None when its later run found no start."""

    p50: float | None
    p90: float | None
    blocked_by: tuple[str, ...] = ()
    reason: str | None = None

    def to_json(self) -> dict[str, Any] | None:
        """The contract's estimatedStart: {"p50", "p90", "blockedBy"}, or None when nothing can be said."""
        if self.p50 is None:
            return None
        return {"p50": rfc3339(self.p50), "p90": rfc3339(self.p90) if self.p90 is not None else None,
                "blockedBy": list(self.blocked_by)}

    def status_fields(self) -> dict[str, Any]:
        """What a Pending status carries of it: estimatedStart, and with a null one estimatedStartReason (why
        nothing can be said, a sentence a person can act on)."""
        fields: dict[str, Any] = {"estimatedStart": self.to_json()}
        if self.p50 is None and self.reason:
            fields["estimatedStartReason"] = self.reason
        return fields


def rfc3339(unix: float) -> str:
    """'2026-01-01T00:20:00Z' (whole seconds, rounded up: a start is never shown early)."""
    return datetime.fromtimestamp(-(-unix // 1), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration_text(seconds: float) -> str:
    """7d, 36h, 90m or 45s: the largest unit that says it whole."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def beyond_horizon(horizon: float) -> str:
    """Why a claim that could be placed has no estimate: the forward runs found it no start."""
    return (f"it does not start within {duration_text(horizon)} of the claims running now, as far as their "
            "runtimes are known (a claim without claimbroker.io/expected-runtime, nor runtimes observed for its "
            "tenant, is taken to run on past that)")


def named(names: Iterable[str]) -> tuple[str, ...]:
    """At most MAX_NAMED names, then 'and N more'."""
    listed = list(dict.fromkeys(names))
    if len(listed) <= MAX_NAMED:
        return tuple(listed)
    return (*listed[:MAX_NAMED], f"and {len(listed) - MAX_NAMED} more")


@dataclass
class EstimateMemo:
    """What estimate_starts keeps from one call to the next, as the allocator keeps its KeptState: selector
    results and prepared claims, and the fleet's flavors (derived from the fleet and the claims alone). The
    shell keeps one per estimator; a call without one starts cold."""

    selectors: SelectorMemo = field(default_factory=SelectorMemo)
    flavors: FleetFlavors | None = None
    # the last forward run's state and queue: the next call's first run is brought back from them to its
    # snapshot in O(what changed), as the allocator's cycles go on from each other (None: built anew)
    carried: tuple[KeptState, WaitingQueue] | None = None
    trials: _Trials | None = None  # per spec, where it could ever be placed (`Fits`)


@dataclass
class _Start:
    at: float
    blocked_by: tuple[str, ...]


class _Forward(ClockedQueue):
    """One forward run: the snapshot's running claims end at their expected ends, one cycle runs at each instant
    something ends or a time rule lets go, and each claim's admission instant is kept."""

    # A claim whose placement search its budget cuts short is not searched on for thousands of cycles at
    # each instant, as simulate does (a few claims that exhaust the search made each run cost seconds,
    # which the allocator's decisions paid beside it): what it would find is left to the next instants.
    most_going_on = 2

    def __init__(self, snapshot: Snapshot, runtimes: Runtimes, quantile: int, horizon: float, exact: int,
                 expected: Mapping[ClaimKey, float | None], sizes: Mapping[ClaimKey, int], memo: EstimateMemo,
                 hopeless: Set[ClaimKey], carried: tuple[KeptState, WaitingQueue] | None = None) -> None:
        assert snapshot.now is not None
        super().__init__(snapshot.fleet, snapshot.classes, snapshot.quotas, snapshot.now)
        self.kept = KeptState(memo=memo.selectors, flavors=memo.flavors)
        self.expected = expected  # each waiting claim's expected runtime, read once for both runs
        self.sizes = sizes  # and the devices it takes
        self.start, self.limit, self.exact = snapshot.now, snapshot.now + horizon, exact
        self.runtimes, self.quantile = runtimes, quantile
        self.unusable_nodes = snapshot.unusable_nodes
        if self.limited:  # when they happened is not known: counted as if now
            self.preempted_at = [(self.now, t) for t, n in snapshot.recent_preemptions.items() for _ in range(n)]
        self.ends: list[tuple[float, int, ClaimKey, Running]] = []  # when each running claim ends
        self.min_ends: list[float] = []  # when each running claim's minRuntime ends
        self.serial = itertools.count()
        self.freed_by: dict[DeviceKey, str] = {}  # per device, the claim whose end (or preemption) freed it last
        self.started: dict[ClaimKey, _Start] = {}
        self.rejected: set[ClaimKey] = set()
        self.order = max((r.allocated_order for r in snapshot.running), default=0)
        held = self._flavors_of_running(snapshot) if runtimes.by_flavor else {}
        for r in snapshot.running:
            self.running[r.key] = r
            since = r.allocated_at if r.allocated_at is not None else self.now
            said = r.expected_runtime
            if said is not None and since + said < self.now and (runtimes.by_tenant or runtimes.default):
                said = None  # run past what it said: it ends as its tenant's runs that ran as long did
            runtime = runtimes.of(r.tenant, held.get(r.key, ()), said)
            self._schedule(r, since, runtime)
        if carried is not None:  # an earlier run's state, brought back to the snapshot's: O(what that run changed)
            self.kept, self.waiting = carried
            initial = {w.key: w for w in snapshot.waiting}
            for key in [k for k in self.waiting if k not in initial]:
                self.waiting.pop(key)
        for w in snapshot.waiting:
            self.waiting.put(w)
        self.hopeless = hopeless  # claims no run starts (never fit, incomplete gangs)
        self.hopeless_left = sum(1 for k in self.waiting if k in hopeless)  # of them, those waiting

    def _flavors_of_running(self, snapshot: Snapshot) -> dict[ClaimKey, set[str | None]]:
        known = Flavors(snapshot.quotas.flavors, self.kept.memo)
        return {r.key: {known.name_of(d) for d in allocated_devices(snapshot.fleet, r.allocation)}
                for r in snapshot.running
                if r.expected_runtime is None or (r.allocated_at or self.now) + r.expected_runtime < self.now}

    def _schedule(self, running: Running, since: float, runtime: Quantiles | None) -> None:
        if runtime is not None:
            end = runtime.end(since, self.now, upper=self.quantile == 1)
            heapq.heappush(self.ends, (end, next(self.serial), running.key, running))
        least = self.quotas.min_runtime(running.tenant)
        if least > 0 and running.allocated_at is not None and running.allocated_at + least > self.now:
            heapq.heappush(self.min_ends, running.allocated_at + least)

    def _free(self, running: Running) -> None:
        name = f"{running.tenant}/{running.name}"
        for key in running.allocation.keys:
            self.freed_by[key] = name

    def apply(self, cycle: CycleResult) -> bool:
        changed = bool(cycle.preemptions)
        for p in cycle.preemptions:  # victims leave the run: see the module's docstring
            victim = self.running.pop(p.victim, None)
            if victim is not None:
                self._free(victim)
            if p.by[0] != p.victim[0]:
                self.preempted_at.append((self.now, p.victim[0]))
        for d in cycle.decisions:
            key = (d.tenant, d.name)
            queued = self.waiting.get(key)
            if queued is None:
                continue
            decision = d.decision
            if decision.allocation is not None:
                self._admit(queued, decision.allocation, cycle)
                changed = True
            elif decision.state is State.REJECTED:
                self.waiting.pop(key)
                self.rejected.add(key)
                self.hopeless_left -= key in self.hopeless
            elif not queued.answered:
                self.waiting.put(replace(queued, answered=True))
        return changed

    def _admit(self, queued: Waiting, allocation: Allocation, cycle: CycleResult) -> None:
        flavors = {cycle.flavors[k][0] for k in allocation.keys if k in cycle.flavors}
        expected = self.expected.get(queued.key)
        self.order += 1
        running = Running(queued.tenant, queued.name, allocation, queued.priority, queued.preemptible,
                          queued.arrival, self.order, self.now, gang_name(queued.claim), expected)
        self.running[queued.key] = running
        self.waiting.pop(queued.key)
        blockers = [self.freed_by[k] for k in allocation.keys if k in self.freed_by]
        if not blockers and self.now > self.start and self.quotas.enforced:
            blockers = [f"quota {queued.tenant}/{f}" for f in sorted(f for f in flavors if f is not None)]
        self.started[queued.key] = _Start(self.now, named(blockers))
        self._schedule(running, self.now, self.runtimes.of(queued.tenant, flavors, expected))

    def min_runtime_ends(self) -> list[float]:
        while self.min_ends and self.min_ends[0] <= self.now:
            heapq.heappop(self.min_ends)
        return self.min_ends[:1]

    def next_end(self) -> float | None:
        """The first end still to come of a claim that runs."""
        ends = self.ends
        while ends and self.running.get(ends[0][2]) is not ends[0][3]:
            heapq.heappop(ends)  # preempted meanwhile
        return ends[0][0] if ends else None

    def run(self) -> None:
        """Settle now, then instant after instant until nothing more can start within the horizon (or `exact`
        claims started)."""
        self.step()
        for _ in range(MAX_INSTANTS):
            if len(self.started) >= self.exact or len(self.waiting) <= self.hopeless_left:
                return
            rule = super().next_instant(self.limit)
            first = self.next_end()
            if first is None or first > self.limit or (rule is not None and rule < first):
                if rule is None:
                    return
                self.now = rule  # a time rule lets go before the next end
            else:
                cutoff = min(first + max(BATCH_SECONDS, BATCH_FRACTION * (first - self.start)), self.limit)
                if rule is not None:
                    cutoff = min(cutoff, rule)
                while (at := self.next_end()) is not None and at <= cutoff:
                    _, _, key, running = heapq.heappop(self.ends)
                    del self.running[key]
                    self._free(running)
                    self.now = at
            self.step()

    def step(self) -> None:
        """One cycle at an instant (and more only while the placement budget cut its work short): what it
        leaves (a preemptor beyond the cycle's attempts) the next instant's cycle decides, as the allocator's
        next cycle would. A claim preempted leaves the run, so no victim waits for a cycle of its own."""
        for _ in range(MAX_GOING_ON):
            result = run_cycle(self.snapshot(), self.kept)
            self.apply(result)
            if not result.deferred:
                return

    def extrapolate(self, turns: Sequence[Waiting], fits: Fits, flat: Mapping[ClaimKey, Quantiles | None]) -> None:
        """The claims still waiting once `exact` were admitted: see the module's docstring. Node by node, as
        devices free there (the running claims' ends, then the extrapolated claims' own), the claim first in
        `turns` of those whose spec fits that node's shape and whose size its free devices hold starts there, and
        runs its `flat` runtime (its tenant's where no flavor is known)."""
        if len(self.started) < self.exact:
            return
        fleet, waiting, hopeless, p90 = self.fleet, self.waiting, self.hopeless, self.quantile == 1
        held: dict[str, int] = {}
        for r in self.running.values():
            held[r.allocation.node] = held.get(r.allocation.node, 0) + len(r.allocation.keys)
        free = {n: len(inventory.devices) - held.get(n, 0) for n, inventory in fleet.nodes.items()
                if n not in self.unusable_nodes}
        # per spec, its claims still waiting in turn order: (turn, claim, size, seconds it runs)
        queues: dict[int, deque[tuple[int, Waiting, int, float | None]]] = {}
        for turn, w in enumerate(turns):
            key = w.key
            if key in waiting and key not in hopeless and (spec := fits.spec.get(key)) is not None:
                runtime = flat.get(key)
                seconds = None if runtime is None else runtime.p90 if p90 else runtime.p50
                queues.setdefault(spec, deque()).append((turn, w, self.sizes[key], seconds))
        by_shape: dict[int, list[deque[tuple[int, Waiting, int, float | None]]]] = {}
        for spec, queue in queues.items():
            for shape in fits.shapes.get(spec, ()):
                by_shape.setdefault(shape, []).append(queue)
        # (when, node, devices freed, by whom): the running claims' ends, and now on each node with room
        events = [(end, r.allocation.node, len(r.allocation.keys), f"{r.tenant}/{r.name}")
                  for end, _, _, r in self.ends if self.running.get(r.key) is r]
        events += [(self.now, n, 0, "") for n, room in free.items() if room > 0]
        heapq.heapify(events)
        while events:
            at, node, count, name = heapq.heappop(events)
            if at > self.limit or node not in free:
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
                self.started[w.key] = _Start(max(at, self.now), (name,) if name else ())
                if seconds is not None:
                    heapq.heappush(events, (max(at, self.now) + seconds, node, size, f"{w.tenant}/{w.name}"))
            free[node] = room


def turns(waiting: Iterable[Waiting]) -> list[Waiting]:
    """The waiting claims as the extrapolation hands out devices: the tenants in turn, each tenant's claims by
    priority, then arrival (a tenant whose claims the core started already has fewer turns left)."""
    by_tenant: dict[str, list[Waiting]] = {}
    for w in sorted(waiting, key=lambda w: (-w.priority, w.arrival, w.name)):
        by_tenant.setdefault(w.tenant, []).append(w)
    return [w for turn in itertools.zip_longest(*by_tenant.values()) for w in turn if w is not None]


def _size(waiting: Waiting) -> int:
    """Devices a claim takes at least (its exact counts; 1 for an All or a firstAvailable request)."""
    total = 0
    for request in waiting.claim.spec.devices.requests:
        exactly = request.exactly
        total += exactly.count if exactly is not None and exactly.count else 1
    return total


def _whole_gangs(started: dict[ClaimKey, _Start], waiting: Iterable[Waiting], incomplete: Set[ClaimKey]) -> None:
    """A complete gang's members start together, when the last does, or none does."""
    gangs: dict[tuple[str, str], list[ClaimKey]] = {}
    for w in waiting:
        if w.key not in incomplete and (gang := gang_name(w.claim)) is not None:
            gangs.setdefault((w.tenant, gang), []).append(w.key)
    for members in gangs.values():
        starts = [started.get(key) for key in members]
        if all(s is None for s in starts):
            continue
        if any(s is None for s in starts):
            for key in members:
                started.pop(key, None)
            continue
        last = max((s for s in starts if s is not None), key=lambda s: s.at)
        for key in members:
            started[key] = last


def incomplete_gangs(waiting: Iterable[Waiting]) -> dict[ClaimKey, Estimate]:
    """The members of gangs not all of whose members wait: none starts before the last arrives."""
    gangs: dict[tuple[str, str], tuple[int, list[ClaimKey]]] = {}
    for w in waiting:
        try:
            gang = gang_of(w.claim.metadata.annotations)
        except InvalidClaim:
            continue
        if gang is not None:
            size, members = gangs.setdefault((w.tenant, gang.name), (gang.size, []))
            members.append(w.key)
    out: dict[ClaimKey, Estimate] = {}
    for (_, name), (size, members) in gangs.items():
        if len(members) < size:
            missing = size - len(members)
            estimate = Estimate(None, None, (f"gang {name}: {missing} member{'s' if missing > 1 else ''} missing",),
                                incomplete_reason(name, len(members), size))
            out.update((key, estimate) for key in members)
    return out


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

    @classmethod
    def of(cls, snapshot: Snapshot, memo: EstimateMemo) -> Fits:
        trials = memo.trials
        if trials is None or not trials.holds(snapshot, memo.selectors):
            trials = memo.trials = _Trials(snapshot, memo.selectors)
        out = cls(shapes=trials.shapes)
        for w in snapshot.waiting:
            found = trials.of(w.claim)
            if found is None:
                out.never[w.key] = REJECTED
            elif (why := found[1]) is not None:
                out.never[w.key] = why
            else:
                out.spec[w.key] = found[0]
        return out


class _Trials:
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


def estimate_starts(snapshot: Snapshot, runtimes: Runtimes, *, horizon: float = HORIZON,
                    exact: int = EXACT_ADMISSIONS, memo: EstimateMemo | None = None) -> dict[ClaimKey, Estimate]:
    """An estimate for every waiting claim of `snapshot` (whose `now` must be set), in its order."""
    if snapshot.now is None:
        raise ValueError("estimate_starts needs the snapshot's now")
    gangs = incomplete_gangs(snapshot.waiting)
    memo = memo if memo is not None else EstimateMemo()
    # a run goes on from an earlier run's kept state unless gangs wait: their clocks are kept there too, and
    # would run on from the earlier run's
    reuse = not any(gang_name(w.claim) for w in snapshot.waiting)
    fits = Fits.of(snapshot, memo)
    never = fits.never
    hopeless = gangs.keys() | never.keys()
    expected = {w.key: expected_runtime(w.claim) for w in snapshot.waiting}
    sizes = {w.key: _size(w) for w in snapshot.waiting}
    low = _Forward(snapshot, runtimes, 0, horizon, exact, expected, sizes, memo, hopeless,
                   memo.carried if reuse else None)
    low.run()
    order = turns(snapshot.waiting)
    flat = {w.key: runtimes.of(w.tenant, (), expected[w.key]) for w in snapshot.waiting}
    low.extrapolate(order, fits, flat)
    memo.flavors = low.kept.flavors
    high = _Forward(snapshot, runtimes, 1, horizon, exact, expected, sizes, memo, hopeless,
                    (low.kept, low.waiting) if reuse else None)
    high.run()
    high.extrapolate(order, fits, flat)
    memo.carried = (high.kept, high.waiting) if reuse else None
    if not reuse:  # gangs wait: each starts whole, when its last member does (the extrapolation places members)
        for run in (low, high):
            _whole_gangs(run.started, snapshot.waiting, gangs.keys())
    out: dict[ClaimKey, Estimate] = {}
    for w in snapshot.waiting:
        key = w.key
        if key in gangs:
            out[key] = gangs[key]
            continue
        a, b = low.started.get(key), high.started.get(key)
        if a is None and b is None:
            reason = never.get(key) or (REJECTED if key in low.rejected else beyond_horizon(horizon))
            out[key] = Estimate(None, None, (), reason)
            continue
        first = a if a is not None else b
        assert first is not None
        p50 = min(s.at for s in (a, b) if s is not None)
        p90 = max(a.at, b.at) if a is not None and b is not None else None
        out[key] = Estimate(p50, p90, first.blocked_by)
    return out
