"""One forward run of the start estimates (issue 39): the decision core run on a clock of its own from a
snapshot. Every running claim ends at its expected end (shared/admission/runtimes.py: the p50 run takes
each runtime's p50, the p90 run its p90; never before now), and at each instant at which claims end or a time
rule lets go (minRuntime ends, a preemption leaves the minute maxPreemptionsPerMinute counts, a gang's wait is
over) one cycle of the core runs, as the allocator's next cycle would (fair share, quotas, priority,
preemption and its limits, gangs), on one KeptState carried from instant to instant; each claim admitted
meanwhile runs its own runtime. A claim's start is the instant it is admitted, with what freed its devices.

Approximations, each cheaper than what it stands for:
- Ends close together are one instant: the ends within max(60 s, 2 % of the time ahead) of the first one are
  taken together at the last of them, so a far future costs a few hundred instants, not one per claim (an
  estimate is never early for it, and late by at most that window).
- One cycle per instant, not cycles until nothing changes: what a cycle leaves (a preemptor past the
  cycle's preemption attempts) waits for the next instant.
- A claim preempted in a forward run leaves it (a running claim carries no claim document to queue it again):
  victims are not estimated a second start.
- A running claim allocated at an unknown time (allocated_at None) is taken as allocated now.
- Only waiting claims are run; claims that arrive later (and may come ahead of them) are not foreseen.
- After its first `exact` admissions a run stops; shared/admission/extrapolation.py places the claims left.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, replace

from shared.admission.cycle import run_cycle
from shared.admission.flavors import Flavors, FleetFlavors
from shared.admission.holdings import allocated_devices
from shared.admission.kept import KeptState
from shared.admission.model import ClaimKey, CycleResult, Running, Snapshot, Waiting
from shared.admission.runtimes import Quantiles, Runtimes
from shared.admission.settling import MAX_GOING_ON
from shared.admission.sim_clock import ClockedQueue
from shared.admission.waiting_queue import WaitingQueue
from shared.dra.claims import gang_name
from shared.dra.matching import SelectorMemo
from shared.dra.results import Allocation, DeviceKey, State

MAX_NAMED = 4  # claims named in blocked_by, then "and N more"
BATCH_SECONDS = 60.0  # ends within this of each other (or a fiftieth of the time ahead) are one instant
BATCH_FRACTION = 0.02
MAX_INSTANTS = 2000  # per forward run: then the claims left get no estimate


def named(names: Iterable[str]) -> tuple[str, ...]:
    """At most MAX_NAMED names, then 'and N more'."""
    listed = list(dict.fromkeys(names))
    if len(listed) <= MAX_NAMED:
        return tuple(listed)
    return (*listed[:MAX_NAMED], f"and {len(listed) - MAX_NAMED} more")


@dataclass
class Start:
    """When a claim starts in a forward run, and what it waited for."""

    at: float
    blocked_by: tuple[str, ...]


class ForwardRun(ClockedQueue):
    """One forward run: the snapshot's running claims end at their expected ends, one cycle runs at each instant
    something ends or a time rule lets go, and each claim's admission instant is kept."""

    # A claim whose placement search its budget cuts short is not searched on for thousands of cycles at
    # each instant, as simulate does (a few claims that exhaust the search made each run cost seconds,
    # which the allocator's decisions paid beside it): what it would find is left to the next instants.
    most_going_on = 2
    decays_past_use = False  # looks ahead with the snapshot's past use as it is

    def __init__(self, snapshot: Snapshot, runtimes: Runtimes, quantile: int, horizon: float, exact: int,
                 expected: Mapping[ClaimKey, float | None], sizes: Mapping[ClaimKey, int],
                 selectors: SelectorMemo, flavors: FleetFlavors | None,
                 hopeless: Set[ClaimKey], carried: tuple[KeptState, WaitingQueue] | None = None) -> None:
        assert snapshot.now is not None
        super().__init__(snapshot.fleet, snapshot.classes, snapshot.quotas, snapshot.now, snapshot.past_use)
        self.kept = KeptState(memo=selectors, flavors=flavors)
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
        self.started: dict[ClaimKey, Start] = {}
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
        self.started[queued.key] = Start(self.now, named(blockers))
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
