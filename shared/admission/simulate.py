"""Offline waves through the same decision core the allocator runs (claimbroker simulate)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shared.admission.kept import KeptState
from shared.admission.model import CycleResult, Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.admission.settling import run_until_settled
from shared.admission.waiting_queue import WaitingQueue
from shared.dra import model as dra
from shared.dra.claims import InvalidClaim, settings_of, with_namespace
from shared.dra.inventory import Fleet
from shared.dra.results import Decision, State

MAX_CYCLES_PER_WAVE = 8  # a wave settles when a cycle changes nothing; preemption victims retry next cycle


@dataclass(frozen=True)
class ClaimOutcome:
    namespace: str
    name: str
    decision: Decision

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state": d.state.value,
            "allocation": d.allocation.to_json() if d.allocation else None,
            "reason": d.reason,
        }


@dataclass
class SimulationResult:
    outcomes: list[ClaimOutcome] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    # claims of a later wave that reuse a name the run has already: not applied, said on stderr by the CLI
    ignored: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"claims": [o.to_json() for o in self.outcomes], "events": self.events}


def read_claim_document(document: Any, default_tenant: str) -> dra.ResourceClaim | InvalidClaim:
    """A claim, or the reason it is not one (an invalid claim is Rejected, it does not stop the run)."""
    name = None
    if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
        name = document["metadata"].get("name")
        namespace = document["metadata"].get("namespace") or default_tenant
    else:
        namespace = default_tenant
    try:
        claim = dra.parse_claim(with_namespace(document, default_tenant) if isinstance(document, dict) else document)
        settings_of(claim)
        return claim
    except (dra.DocumentError, InvalidClaim) as error:
        return InvalidClaim(str(error), name=name if isinstance(name, str) else None, namespace=namespace)


def _waiting(claim: dra.ResourceClaim, arrival: int) -> Waiting:
    settings = settings_of(claim)
    return Waiting(claim.metadata.namespace or "default", claim.metadata.name, claim, settings.priority,
                   settings.preemptible, arrival)


def run_waves(
    fleet: Fleet,
    classes: Mapping[str, dra.DeviceClass],
    waves: Sequence[Sequence[dra.ResourceClaim | InvalidClaim]],
    quotas: QuotaConfig | None = None,
) -> SimulationResult:
    """Each wave arrives at once and is settled: admission in fair-share order, preemption, and more
    cycles while they change anything (victims and earlier claims try again)."""
    kept = KeptState()  # what one cycle keeps for the next, as the allocator keeps it
    quotas = quotas or QuotaConfig()
    final: dict[tuple[str, str], ClaimOutcome] = {}
    result = SimulationResult()
    waiting = WaitingQueue()  # each cycle is handed what came and went since the last
    running: dict[tuple[str, str], Running] = {}
    documents: dict[tuple[str, str], dra.ResourceClaim] = {}
    displaced: dict[tuple[str, str], frozenset[tuple[str, str]]] = {}
    arrival = 0
    allocated = 0

    def snapshot() -> Snapshot:
        all_waiting, changes = waiting.snapshot()
        return Snapshot(fleet, classes, quotas, tuple(running.values()), all_waiting, changes=changes)

    def apply(cycle: CycleResult) -> bool:
        nonlocal allocated
        changed = bool(cycle.preemptions)
        for p in cycle.preemptions:  # back to the queue, with the arrival they first had
            victim = running.pop(p.victim)
            displaced[p.victim] = displaced.get(p.victim, frozenset()) | {p.by}
            waiting.put(Waiting(victim.tenant, victim.name, documents[p.victim], victim.priority,
                                victim.preemptible, victim.arrival, displaced_by=displaced[p.victim]))
            final[p.victim] = ClaimOutcome(victim.tenant, victim.name, Decision(State.PREEMPTED, reason=p.reason))
            result.events.append({"claim": "/".join(p.victim), "state": State.PREEMPTED.value,
                                  "by": "/".join(p.by), "rule": p.rule, "reason": p.reason})
        for d in cycle.decisions:
            key = (d.tenant, d.name)
            final[key] = ClaimOutcome(d.tenant, d.name, d.decision)
            queued = waiting.get(key)
            if d.decision.allocation is not None and queued is not None:
                allocated += 1
                running[key] = Running(queued.tenant, queued.name, d.decision.allocation, queued.priority,
                                       queued.preemptible, queued.arrival, allocated)
                waiting.pop(key)
                changed = True
            elif d.decision.state is State.REJECTED:
                waiting.pop(key)
            elif queued is not None and not queued.answered:
                waiting.put(replace(queued, answered=True))
        return changed

    for index, wave in enumerate(waves):
        for position, item in enumerate(wave):
            if isinstance(item, InvalidClaim):
                key = (item.namespace or "default", item.name or f"wave-{index + 1}-document-{position + 1}")
                final[key] = ClaimOutcome(key[0], key[1], Decision(State.REJECTED, reason=str(item)))
                continue
            arrival += 1
            w = _waiting(item, arrival)
            if w.key in running or w.key in waiting:  # claims are immutable: the first one with a name stands
                result.ignored.append(f"wave {index + 1}: claim {'/'.join(w.key)} is not applied: a claim of that "
                                      f"name waits or runs already (release it first to change it)")
                continue
            waiting.put(w)
            documents[w.key] = item
        run_until_settled(snapshot, kept, apply, most_changing=MAX_CYCLES_PER_WAVE)
    result.outcomes = list(final.values())
    return result
