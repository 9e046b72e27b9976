"""Offline waves through the same decision core the allocator runs (claimbroker simulate), on a clock of
its own: Advance documents let time pass, so time rules (minRuntime, maxPreemptionsPerMinute) hold as in
the allocator, and past use (fairSharing.halfLife) decays and grows with what runs meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from shared.admission.estimates import Estimate, Runtimes, estimate_starts
from shared.admission.model import ClaimKey, CycleResult, Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.admission.sim_clock import ClockedQueue
from shared.admission.wave_documents import Advance, Release, WaveItem, read_claim_document
from shared.dra import model as dra
from shared.dra.claims import InvalidClaim, expected_runtime, gang_name, settings_of
from shared.dra.inventory import Fleet
from shared.dra.results import Decision, State

__all__ = ["SIMULATION_START", "ClaimOutcome", "SimulationResult", "read_claim_document", "run_waves"]

MAX_CYCLES_PER_WAVE = 8  # a wave settles when a cycle changes nothing; preemption victims retry next cycle
# Where the simulated clock starts: a fixed instant, so that the same files give the same output.
SIMULATION_START = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
# Within one Advance, the instants at which a time rule lets go (a minRuntime ends, a preemption leaves the
# minute maxPreemptionsPerMinute counts) are settled in turn, as the allocator's cycles would meet them; at
# most this many, then the clock goes on to the Advance's end.
MAX_INSTANTS_PER_ADVANCE = 1000
RELEASED = Decision(State.RELEASED, reason="released by the tenant")


@dataclass(frozen=True)
class ClaimOutcome:
    namespace: str
    name: str
    decision: Decision
    # a Pending claim's start estimate on the simulated clock (shared/admission/estimates.py); None otherwise
    estimate: Estimate | None = None

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        out = {
            "namespace": self.namespace,
            "name": self.name,
            "state": d.state.value,
            "allocation": d.allocation.to_json() if d.allocation else None,
            "reason": d.reason,
        }
        if d.state is State.PENDING:  # the contract's estimatedStart: null when nothing can be said, and why
            out.update(self.estimate.status_fields() if self.estimate is not None else {"estimatedStart": None})
        return out


@dataclass
class SimulationResult:
    outcomes: list[ClaimOutcome] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    # what the run did not apply, said on stderr by the CLI: claims of a later wave that reuse a name the
    # run has already, Releases of claims that neither wait nor run
    ignored: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"claims": [o.to_json() for o in self.outcomes], "events": self.events}


def _waiting(claim: dra.ResourceClaim, arrival: int) -> Waiting:
    settings = settings_of(claim)
    return Waiting(claim.metadata.namespace or "default", claim.metadata.name, claim, settings.priority,
                   settings.preemptible, arrival)


class _Simulation(ClockedQueue):
    """What runs and what waits on the simulated clock, applied from each cycle's result as the allocator
    applies it to the ledger (allocation times included)."""

    def __init__(self, fleet: Fleet, classes: Mapping[str, dra.DeviceClass], quotas: QuotaConfig,
                 start: float) -> None:
        super().__init__(fleet, classes, quotas, start)
        self.final: dict[ClaimKey, ClaimOutcome] = {}
        self.result = SimulationResult()
        self.documents: dict[ClaimKey, dra.ResourceClaim] = {}
        self.displaced: dict[ClaimKey, frozenset[ClaimKey]] = {}
        self.arrival = 0
        self.allocated = 0

    most_changing = MAX_CYCLES_PER_WAVE

    def apply(self, cycle: CycleResult) -> bool:
        changed = bool(cycle.preemptions)
        for p in cycle.preemptions:  # back to the queue, with the arrival they first had
            victim = self.running.pop(p.victim)
            self.displaced[p.victim] = self.displaced.get(p.victim, frozenset()) | {p.by}
            self.waiting.put(Waiting(victim.tenant, victim.name, self.documents[p.victim], victim.priority,
                                     victim.preemptible, victim.arrival, displaced_by=self.displaced[p.victim]))
            self.final[p.victim] = ClaimOutcome(victim.tenant, victim.name,
                                                Decision(State.PREEMPTED, reason=p.reason))
            self.result.events.append({"claim": "/".join(p.victim), "state": State.PREEMPTED.value,
                                       "by": "/".join(p.by), "rule": p.rule, "reason": p.reason})
            if p.by[0] != p.victim[0]:
                self.preempted_at.append((self.now, p.victim[0]))
        for d in cycle.decisions:
            key = (d.tenant, d.name)
            self.final[key] = ClaimOutcome(d.tenant, d.name, d.decision)
            queued = self.waiting.get(key)
            if d.decision.allocation is not None and queued is not None:
                self.allocated += 1
                self.running[key] = Running(queued.tenant, queued.name, d.decision.allocation, queued.priority,
                                            queued.preemptible, queued.arrival, self.allocated, self.now,
                                            gang_name(queued.claim), expected_runtime(queued.claim))
                self.waiting.pop(key)
                changed = True
            elif d.decision.state is State.REJECTED:
                self.waiting.pop(key)
            elif queued is not None and not queued.answered:
                self.waiting.put(replace(queued, answered=True))
        return changed

    def pass_time(self, seconds: float) -> None:
        """Let `seconds` pass: each instant within them at which a time rule lets go is settled in turn."""
        end = self.now + seconds
        for _ in range(MAX_INSTANTS_PER_ADVANCE):
            instant = self.next_instant(end)
            if instant is None:
                break
            self.now = instant
            self.ask_again()
            self.settle()
        self.now = end
        self.current_past_use()  # what ran until now counts before a Release of this wave ends it
        self.ask_again()

    def estimate(self) -> None:
        """Each Pending claim's start estimate from where the run ends, on its clock: the decision core run
        forward (shared/admission/estimates.py), with the claims' expected-runtime annotations as the only
        runtimes (a running claim without one never ends within the estimate's horizon)."""
        pending = [key for key, o in self.final.items() if o.decision.state is State.PENDING and key in self.waiting]
        if not pending:
            return
        snapshot = Snapshot(self.fleet, self.classes, self.quotas, tuple(self.running.values()),
                            tuple(self.waiting.values()), now=self.now, recent_preemptions=self.recent_preemptions(),
                            past_use=self.current_past_use())
        estimates = estimate_starts(snapshot, Runtimes())
        for key in pending:
            self.final[key] = replace(self.final[key], estimate=estimates.get(key))

    def release(self, release: Release, wave: int) -> None:
        key = release.key
        if self.running.pop(key, None) is None and self.waiting.pop(key) is None:
            self.result.ignored.append(f"wave {wave}: Release of {'/'.join(key)} changes nothing: no claim of that "
                                       "name waits or runs")
            return
        self.documents.pop(key, None)
        self.displaced.pop(key, None)  # a claim submitted again under its name starts afresh
        self.final[key] = ClaimOutcome(key[0], key[1], RELEASED)

    def arrive(self, claim: dra.ResourceClaim, wave: int) -> None:
        self.arrival += 1
        w = _waiting(claim, self.arrival)
        if w.key in self.running or w.key in self.waiting:  # claims are immutable: the first one with a name stands
            self.result.ignored.append(f"wave {wave}: claim {'/'.join(w.key)} is not applied: a claim of that "
                                       f"name waits or runs already (release it first to change it)")
            return
        self.waiting.put(w)
        self.documents[w.key] = claim


def run_waves(
    fleet: Fleet,
    classes: Mapping[str, dra.DeviceClass],
    waves: Sequence[Sequence[WaveItem]],
    quotas: QuotaConfig | None = None,
    *,
    start: float = SIMULATION_START,
    estimates: bool = True,
) -> SimulationResult:
    """Each wave, in turn: its Advances let time pass (settling whatever a time rule lets go meanwhile),
    its Releases release, its claims arrive at once, and it is settled: admission in fair-share order,
    preemption, and more cycles while they change anything (victims and earlier claims try again). The
    clock starts at `start`; without Advances every wave arrives at that instant. With `estimates`, each claim
    still Pending at the end gets its start estimate from there."""
    run = _Simulation(fleet, classes, quotas or QuotaConfig(), start)
    for index, wave in enumerate(waves):
        number = index + 1
        seconds = sum(item.seconds for item in wave if isinstance(item, Advance))
        if seconds > 0:
            run.pass_time(seconds)
        for item in wave:
            if isinstance(item, Release):
                run.release(item, number)
        for position, item in enumerate(wave):
            if isinstance(item, InvalidClaim):
                key = (item.namespace or "default", item.name or f"wave-{number}-document-{position + 1}")
                run.final[key] = ClaimOutcome(key[0], key[1], Decision(State.REJECTED, reason=str(item)))
            elif isinstance(item, dra.ResourceClaim):
                run.arrive(item, number)
        run.settle()
    if estimates:
        run.estimate()
    run.result.outcomes = list(run.final.values())
    return run.result
