"""Gangs in the admission pass: an incomplete gang holds nothing and says how many members it has; a
complete one is tried as one unit, at its tenant's share after admitting it whole, and either every member
is admitted in this cycle or none is (what the earlier members took is given back).
"""

from __future__ import annotations

from shared.admission.gangs import GangUnit
from shared.admission.model import UNANSWERED, Block, Waiting
from shared.admission.state import AdmissionState
from shared.dra.results import Allocation, Decision, State

Decided = tuple[Waiting, Decision, list[Block]]


def gang_units(cycle: AdmissionState) -> tuple[list[Decided], list[GangUnit]]:
    """The answers of members that disagree with their gang (Rejected) and of incomplete gangs (Pending,
    only where the answer changed), and the complete gangs to try."""
    gangs = cycle.gangs
    units, disagree = gangs.units()
    decided: list[Decided] = [(w, Decision(State.REJECTED, reason=why), []) for w, why in disagree]
    complete = []
    for unit in units:
        if unit.complete:
            complete.append(unit)
            continue
        reason = f"gang {unit.name}: {len(unit.members)} of {unit.settings.size} members received"
        decided.extend((m, Decision(State.PENDING, reason=reason), []) for m in unit.members if gangs.due(m, reason))
    return decided, complete


def gang_units_of(cycle: AdmissionState, unit: GangUnit) -> float:
    """The GPU units the gang takes at least (each member's fewest devices at its cheapest flavor)."""
    values = {f.name: f.value for f in cycle.snapshot.quotas.flavors}
    total = 0.0
    for member in unit.members:
        flavors, least = cycle.room.claim_facts(member)[:2]
        if least:
            total += least * min((values[f] for f in flavors if f in values), default=0.0)
    return total


def share_after(cycle: AdmissionState, unit: GangUnit, units: float) -> float:
    """The gang's place in fair-share order: its tenant's share after admitting the whole gang."""
    tenant = unit.key[0]
    return cycle.book.share(tenant) + units / cycle.book.weight(tenant)


def try_gang(cycle: AdmissionState, unit: GangUnit) -> list[Decided]:
    """Every member placed in turn on the fleet as the earlier members left it, under its tenant's quota
    with the earlier members counted: all admitted, or none (the earlier ones given back) with the reason
    of the member that does not fit. Placements that fail here are not kept as failed for the rest of the
    pass (what a gang took is given back), so the trial runs outside the pass's shrinking cache."""
    trials = cycle.trials
    shrinking, trials.shrinking = trials.shrinking, None
    placed: list[tuple[Waiting, Allocation]] = []
    try:
        members = sorted(unit.members, key=lambda m: (-(cycle.room.claim_facts(m).least or 0), m.arrival, m.name))
        for member in members:
            decision, blocks = trials.try_admit(member)
            if decision.allocation is None:
                decision, blocks = _why(cycle, member, decision, blocks)
                for earlier, _ in reversed(placed):
                    cycle.withdraw(earlier)
                return _refused(cycle, unit, member, decision, blocks)
            cycle.admit(member, decision.allocation)
            placed.append((member, decision.allocation))
    finally:
        trials.shrinking = shrinking
    for member, _ in placed:
        cycle.gangs.told.pop(member.key, None)
    return [(m, Decision(State.ALLOCATED, allocation), []) for m, allocation in placed]


def _why(cycle: AdmissionState, member: Waiting, decision: Decision, blocks: list[Block]
         ) -> tuple[Decision, list[Block]]:
    """The member's reason, worked out while the earlier members still hold what they took."""
    if decision is UNANSWERED or (decision.state is State.PENDING and decision.reason is None):
        return cycle.answers.answer(member, decision, blocks)
    return decision, blocks


def _refused(cycle: AdmissionState, unit: GangUnit, member: Waiting, decision: Decision, blocks: list[Block]
             ) -> list[Decided]:
    """Every member's answer when `member` does not fit: Pending, naming it and its reason."""
    reason = f"gang {unit.name}: member {member.name} does not fit: {decision.reason}"
    told = Decision(State.PENDING, reason=reason, unsatisfiable=decision.unsatisfiable, cut=decision.cut)
    gangs = cycle.gangs
    return [(m, told, blocks) for m in unit.members if decision.cut or gangs.due(m, reason)]
