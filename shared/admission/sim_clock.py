"""What runs and what waits on a clock of its own, applied cycle after cycle as the allocator applies its
results: the bookkeeping `simulate` (shared/admission/simulate.py) and the start estimates
(shared/admission/estimates.py) share. Each keeps one KeptState across its cycles, as the allocator does.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from shared.admission.flavors import Flavors
from shared.admission.kept import KeptState
from shared.admission.model import ClaimKey, CycleResult, Running, Snapshot
from shared.admission.past_use import PastUse, advance_past_use, units_in_use
from shared.admission.quota import QuotaConfig
from shared.admission.settling import MAX_GOING_ON, run_until_settled
from shared.admission.waiting_queue import WaitingQueue
from shared.dra import model as dra
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo

PREEMPTION_WINDOW = 60.0  # maxPreemptionsPerMinute counts the preemptions of the minute before


class ClockedQueue:
    """The fleet's running claims and waiting queue at `now`, cycles run on them until they settle, and the
    instants at which a time rule lets go. Subclasses apply a cycle's result (`apply`)."""

    most_changing = 8  # cycles that change something per settling; preemption victims retry in the next
    most_going_on = MAX_GOING_ON  # cycles that only go on with placement work a budget cut short
    # Past use (fairSharing.halfLife) decays as the clock moves, as the allocator's ledger keeps it; a run
    # that only looks ahead (start estimates) keeps the snapshot's past use as it was.
    decays_past_use = True

    def __init__(self, fleet: Fleet, classes: Mapping[str, dra.DeviceClass], quotas: QuotaConfig,
                 start: float, past_use: PastUse | None = None) -> None:
        self.fleet, self.classes, self.quotas = fleet, classes, quotas
        self.now = start
        self.past_use: PastUse = dict(past_use or {})  # at `past_at`, per (tenant, flavor) in GPU units
        self.past_at = start
        self._flavors: Flavors | None = None
        self.kept = KeptState()  # what one cycle keeps for the next, as the allocator keeps it
        self.waiting = WaitingQueue()  # each cycle is handed what came and went since the last
        self.running: dict[ClaimKey, Running] = {}
        # fair-share and reclaim preemptions (by another tenant's claim): when, and the victim's tenant
        self.limited = any(t.max_preemptions_per_minute is not None for t in quotas.tenants.values())
        self.preempted_at: list[tuple[float, str]] = []
        self.unusable_nodes: Mapping[str, str] = {}  # nodes nothing is placed on, and why

    def snapshot(self) -> Snapshot:
        all_waiting, changes = self.waiting.snapshot()
        return Snapshot(self.fleet, self.classes, self.quotas, tuple(self.running.values()), all_waiting,
                        unusable_nodes=self.unusable_nodes, changes=changes, now=self.now,
                        recent_preemptions=self.recent_preemptions(), past_use=self.current_past_use())

    def current_past_use(self) -> PastUse:
        """Past use brought up to now: what runs now has run since it was last brought up to date (claims
        start and end only in cycles, each of which first asks for a snapshot at its instant)."""
        if self.quotas.half_life <= 0 or not self.decays_past_use or self.now <= self.past_at:
            return self.past_use
        if self._flavors is None:
            self._flavors = Flavors(self.quotas.flavors, SelectorMemo())
        in_use = units_in_use(self.fleet, self.running.values(), self._flavors)
        self.past_use = advance_past_use(self.past_use, in_use, self.now - self.past_at, self.quotas.half_life)
        self.past_at = self.now
        return self.past_use

    def recent_preemptions(self) -> dict[str, int]:
        """Per tenant, its claims preempted for fair share or reclaim in the minute before now (as the
        allocator reads them from the ledger)."""
        if not self.limited:
            return {}
        since = self.now - PREEMPTION_WINDOW
        self.preempted_at = [(at, tenant) for at, tenant in self.preempted_at if at >= since]
        return dict(Counter(tenant for _, tenant in self.preempted_at))

    def apply(self, cycle: CycleResult) -> bool:
        raise NotImplementedError

    def settle(self) -> None:
        run_until_settled(self.snapshot, self.kept, self.apply, most_changing=self.most_changing,
                          most_going_on=self.most_going_on)

    def ask_again(self) -> None:
        """Time passed: every waiting claim is decided again, as the allocator refreshes its answers."""
        for queued in list(self.waiting.values()):
            if queued.answered:
                self.waiting.put(replace(queued, answered=False))

    def min_runtime_ends(self) -> list[float]:
        """When each running claim's minRuntime ends (those that have one)."""
        return [r.allocated_at + least for r in self.running.values()
                if r.allocated_at is not None and (least := self.quotas.min_runtime(r.tenant)) > 0]

    def next_instant(self, end: float) -> float | None:
        """The first instant after now and by `end` at which a waiting claim may decide otherwise: a
        running claim's minRuntime ends, a preemption leaves the minute maxPreemptionsPerMinute counts, or a
        gang's wait is over."""
        if not self.waiting:
            return None
        instants = self.min_runtime_ends()
        if self.limited:  # counted while at >= now - 60: out of the count just after
            instants += [math.nextafter(at + PREEMPTION_WINDOW, math.inf) for at, _ in self.preempted_at]
        instants += self.gang_instants()
        return min((t for t in instants if self.now < t <= end), default=None)

    def gang_instants(self) -> list[float]:
        """When a waiting gang's gangReserveAfter is over (it keeps what it needs from then on) and when a
        `preferred` gang's gang-topology-wait is over (it may be split from then on)."""
        admission = self.kept.admission
        if admission is None or not admission.gangs.gangs:
            return []
        gangs = admission.gangs
        instants = [since + after for (tenant, _), since in gangs.first_since.items()
                    if (after := self.quotas.gang_reserve_after(tenant)) > 0]
        for key, since in gangs.complete_since.items():
            members = gangs.gangs.get(key)
            if members:
                instants.append(since + next(iter(members.values()))[1].wait)
        return instants
