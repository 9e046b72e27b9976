"""Gangs in the admission pass: an incomplete gang holds nothing and says how many members it has; a
complete one is tried as one unit, at its tenant's share after admitting it whole, and either every member
is admitted in this cycle or none is (what the earlier members took is given back).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from shared.admission.gang_topology import confined, usable_nodes
from shared.admission.gangs import GangKey, GangUnit
from shared.admission.model import UNANSWERED, Block, Waiting
from shared.admission.preemption import rooms_with_victims, try_preempt
from shared.admission.quota_room import QuotaRoom
from shared.admission.state import AdmissionState
from shared.contract.gang_reasons import incomplete_reason
from shared.dra.plan import Plan
from shared.dra.results import Allocation, Decision, DeviceResult, Rejected, State

MAX_PREEMPTION_VALUES = 4  # values of a topology key a refused gang searches for victims on, most free first
RESERVED = "gang-reserve"  # the request name of the devices a starving gang holds (never given to a claim)

Decided = tuple[Waiting, Decision, list[Block]]


def gang_units(cycle: AdmissionState) -> tuple[list[Decided], list[GangUnit]]:
    """The answers of members that disagree with their gang (Rejected) and of incomplete gangs (Pending,
    only where the answer changed), both only for the gangs that changed, and the complete gangs to try."""
    gangs = cycle.gangs
    complete, changed = gangs.units()
    decided: list[Decided] = []
    for unit, disagree in changed:
        for waiting, why in disagree:
            decided.append((waiting, Decision(State.REJECTED, reason=why), []))
            gangs.lose(waiting, unit.name)
        if unit.complete:
            continue
        reason = incomplete_reason(unit.name, len(unit.members), unit.settings.size, gangs.missing(unit.key))
        decided.extend((m, Decision(State.PENDING, reason=reason), []) for m in unit.members if gangs.due(m, reason))
    return decided, complete


class UnitFacts:
    """What the pass reads of a gang unit that its members' specs decide (with the state's fleet and quotas)."""

    __slots__ = ("units", "members", "need", "alike", "usable", "plans")

    def __init__(self, units: float, members: tuple[Waiting, ...], need: int) -> None:
        self.units = units  # the GPU units it takes at least (each member's fewest devices at its cheapest flavor)
        self.members = members  # in trial order: the most devices first, then arrival and name
        self.need = need  # the devices its members take at least
        # with a topology key, worked out at its first trial: whether every member has the same spec, and the
        # nodes a confined trial closes
        self.alike: bool | None = None
        self.usable: frozenset[str] | None = None
        self.plans: tuple[Plan, ...] | None = None  # its members' distinct plans, as its stamp reads them


# per gang, the facts of its unit as last worked out: valid while the unit is the same object (a unit is
# rebuilt when its members change or are answered), in the same admission state (its quota room: the fleet
# and quotas are fixed) and plan memo (the plans are prepared anew after a clearing). One entry per gang,
# so what is kept follows the gangs, not how often they change; cleared when full
_FACTS: dict[tuple[str, str], tuple[GangUnit, QuotaRoom, int, UnitFacts]] = {}
_MAX_FACTS = 10_000


def unit_facts(cycle: AdmissionState, unit: GangUnit) -> UnitFacts:
    """The unit's facts, worked out once per unit and admission state: many gangs wait complete, and a
    cycle tries each of them."""
    room = cycle.room
    kept = _FACTS.get(unit.key)
    if kept is not None and kept[0] is unit and kept[1] is room and kept[2] == cycle.memo.plans_cleared:
        return kept[3]
    values = {f.name: f.value for f in cycle.snapshot.quotas.flavors}
    total = 0.0
    need = 0
    for member in unit.members:
        flavors, least = room.claim_facts(member)[:2]
        if least:
            total += least * min((values[f] for f in flavors if f in values), default=0.0)
            need += least
    members = sorted(unit.members, key=lambda m: (-(room.claim_facts(m).least or 0), m.arrival, m.name))
    if len(_FACTS) >= _MAX_FACTS and unit.key not in _FACTS:
        _FACTS.clear()
    found = UnitFacts(total, tuple(members), need)
    _FACTS[unit.key] = (unit, room, cycle.memo.plans_cleared, found)
    return found


def gang_units_of(cycle: AdmissionState, unit: GangUnit) -> float:
    """The GPU units the gang takes at least (each member's fewest devices at its cheapest flavor)."""
    return unit_facts(cycle, unit).units


def share_after(cycle: AdmissionState, unit: GangUnit, units: float) -> float:
    """The gang's place in fair-share order: its tenant's share after admitting the whole gang."""
    tenant = unit.key[0]
    return cycle.book.share(tenant) + units / cycle.book.weight(tenant)


def try_gang(cycle: AdmissionState, unit: GangUnit) -> list[Decided]:
    """All members admitted, or none with the reason of the member that does not fit. With a topology key,
    on the nodes of one value of it, the values with the most free tried first; `preferred` splits across
    values once no value fits and its wait is over (best effort: one value if any fits, else anywhere).

    Placements that fail here are not kept as failed for the rest of the pass (what a gang took is given
    back), so the trial runs outside the pass's shrinking cache."""
    trials = cycle.trials
    shrinking, trials.shrinking = trials.shrinking, None
    try:
        members = unit_facts(cycle, unit).members
        key = unit.settings.topology
        failed = cycle.gangs.failed_at.get(unit.key)
        if failed is not None and failed[0] == _stamp(cycle, unit):
            outcome = failed[1]  # nothing it reads changed since it did not fit
        elif key is None:
            outcome = _place(cycle, members)
            if isinstance(outcome, Refusal) and not outcome.decision.cut:
                cycle.gangs.failed_at[unit.key] = (_stamp(cycle, unit), outcome)
        else:
            outcome = _place_on_one_value(cycle, unit, members, key)
            split = isinstance(outcome, Refusal) and _may_split(cycle, unit)
            if split:
                outcome = _place(cycle, members)
            # kept unless a wait still to pass may let it split later (time, not what it reads, changes that)
            waits = unit.settings.mode == "preferred" and not split
            if isinstance(outcome, Refusal) and not outcome.decision.cut and not waits:
                cycle.gangs.failed_at[unit.key] = (_stamp(cycle, unit), outcome)
    finally:
        trials.shrinking = shrinking
    if isinstance(outcome, Refusal):
        cycle.gangs.refused_now.append(unit)  # it may preempt, after the pass
        if _reserving(cycle, unit):
            _reserve(cycle, unit, members)
        return _refused(cycle, unit, outcome)
    cycle.gangs.first_since.pop(unit.key, None)
    for member, _ in outcome:
        cycle.gangs.told.pop(member.key, None)
    return [(m, Decision(State.ALLOCATED, allocation), []) for m, allocation in outcome]


def _stamp(cycle: AdmissionState, unit: GangUnit) -> tuple[Any, ...]:
    """What a gang's trial reads: its members' capacity versions (a placement under a flavor reads a
    subset of the devices) and the quota versions of its tenant's cohort and the free capacity."""
    placement, book = cycle.placement, cycle.book
    facts = unit_facts(cycle, unit)
    if facts.plans is None:  # alike members: one plan
        facts.plans = tuple({id(p): p for p in (placement.plan(m.claim) for m in unit.members)}.values())
    return (tuple(placement.capacity_version(p) for p in facts.plans),
            book.cohort_version(unit.key[0]), book.free_version)


def _reserving(cycle: AdmissionState, unit: GangUnit) -> bool:
    """Whether the gang keeps the devices it needs: it has been first in its tenant's order (no waiting
    claim of its tenant of a higher priority, or as high and earlier) for its tenant's gangReserveAfter.
    Without a clock, or with gangReserveAfter 0s, never."""
    tenant, now = unit.key[0], cycle.snapshot.now
    after = cycle.snapshot.quotas.gang_reserve_after(tenant)
    first_since = cycle.gangs.first_since
    if now is None or after <= 0:
        return False
    heads = cycle.queue.tenant_heads.get(tenant)
    if heads and heads[0][0] < (-unit.priority, unit.arrival, ""):
        first_since.pop(unit.key, None)  # a claim of its tenant comes before it
        return False
    return now - first_since.setdefault(unit.key, now) >= after


def _reserve(cycle: AdmissionState, unit: GangUnit, members: Sequence[Waiting]) -> None:
    """Hold, until the cycle ends, the free devices the members would take on the nodes with the most
    free of what each member's first request accepts (one node per member, as many as it takes at
    least): claims that fair share places after the gang cannot take them, and the nodes fill for it as
    devices free (with a topology key, within the value with the most free)."""
    placement = cycle.placement
    allowed: frozenset[str] | None = None
    if unit.settings.topology is not None:
        domains = cycle.gangs.domains.of(cycle.fleet, unit.settings.topology)
        if not domains:
            return
        allowed = frozenset(domains[cycle.gangs.domains.free_ordered(placement, members[0], domains)[1][0]])
    for member in members:
        try:
            index = placement.index(placement.plan(member.claim).variants[0][0])
        except (Rejected, IndexError):
            continue
        want = cycle.room.claim_facts(member).least or 1
        best: tuple[int, str] | None = None
        for node in sorted(index.nodes):
            if allowed is not None and node not in allowed:
                continue
            count = len(index.free_on(node))
            if count and (best is None or count > best[0]):
                best = (count, node)
        if best is None:
            continue
        devices = index.free_on(best[1])[:want]
        held = Allocation(best[1], tuple(DeviceResult(RESERVED, d.driver, d.pool, d.name) for d in devices))
        placement.take(held)
        cycle.gangs.held_now.setdefault(unit.key, []).append(held)


def release_reserved(cycle: AdmissionState) -> None:
    """The cycle ends: what gangs held for themselves is free again (they take it again at their turn)."""
    for key in list(cycle.gangs.held_now):
        _give_back_held(cycle, key)


def _give_back_held(cycle: AdmissionState, key: GangKey) -> list[Allocation]:
    """What the gang held for itself in this cycle, free again; returned so it may be held again."""
    held = cycle.gangs.held_now.pop(key, [])
    for allocation in reversed(held):
        cycle.placement.give_back(allocation)
    return held


def preempt_for_gang(cycle: AdmissionState, unit: GangUnit) -> list[Decided]:
    """A gang refused in the pass, with victims: each member admitted where it fits, else with the victims
    the preemption search finds for it (whole gangs, by the usual rules), and kept only if every member is
    then admitted; otherwise every victim is restored and every member given back (nothing is preempted
    for a gang that would still not be whole). With a topology key that it may not split across, all of
    it on one value: the values with the most free first, victims only on that value's nodes."""
    held = _give_back_held(cycle, unit.key)  # what it keeps for itself is its own to use
    facts = unit_facts(cycle, unit)
    members = facts.members
    key = unit.settings.topology
    if facts.alike is None:
        facts.alike = len({id(m.claim) for m in members}) == 1 or len({_spec(cycle, m) for m in members}) == 1
    placed: list[tuple[Waiting, Allocation]] | None = None
    if key is None or _may_split(cycle, unit):
        placed = _preempt_members(cycle, members, None)
    elif domains := cycle.gangs.domains.of(cycle.fleet, key):
        if facts.usable is None:
            facts.usable = usable_nodes(cycle.placement, members)
        values = list(cycle.gangs.domains.free_ordered(cycle.placement, members[0], domains)[1])
        plan = cycle.placement.plan(members[0].claim)
        # alike members of one request and placement each: a value whose free and preemptible devices that
        # request accepts fall short of the gang is not searched
        if facts.alike and len(plan.variants) == 1 and len(plan.requests) == 1:
            rooms = rooms_with_victims(cycle, members[0], domains)
            values = [v for v in values if rooms[v] >= facts.need]
        for value in values[:MAX_PREEMPTION_VALUES]:
            with confined(cycle.placement, cycle.fleet, domains[value], facts.usable):
                placed = _preempt_members(cycle, members, frozenset(domains[value]))
            if placed is not None:
                break
    if placed is None:
        for allocation in held:  # kept for it again until the cycle ends
            cycle.placement.take(allocation)
        if held:
            cycle.gangs.held_now[unit.key] = held
        if (failed := cycle.gangs.failed_at.get(unit.key)) is not None:  # as the trial left it
            cycle.gangs.failed_at[unit.key] = (_stamp(cycle, unit), failed[1])
        return []
    for member, _ in placed:
        cycle.gangs.told.pop(member.key, None)
    return [(m, Decision(State.ALLOCATED, allocation), []) for m, allocation in placed]


def _preempt_members(cycle: AdmissionState, members: Sequence[Waiting], within: frozenset[str] | None
                     ) -> list[tuple[Waiting, Allocation]] | None:
    """Every member admitted, with victims where it does not fit (only on `within`'s nodes when given), or
    None with everything it took and preempted given back."""
    mark = len(cycle.preemptions)
    placed: list[tuple[Waiting, Allocation]] = []
    for member in members:
        decision, _ = cycle.trials.try_admit(member)
        if decision.allocation is not None:
            cycle.admit(member, decision.allocation)
        else:
            decision = try_preempt(cycle, member, within) or decision
            if decision.allocation is None or (within is not None and decision.allocation.node not in within):
                if decision.allocation is not None:  # a victim's gang mate freed room outside the value
                    placed.append((member, decision.allocation))
                _undo(cycle, placed, mark)
                return None
        placed.append((member, decision.allocation))
    return placed


def _undo(cycle: AdmissionState, placed: list[tuple[Waiting, Allocation]], mark: int) -> None:
    """Give back what the members took and restore the claims preempted for them since `mark`."""
    for member, _ in reversed(placed):
        cycle.withdraw(member)
    undone = cycle.preemptions[mark:]
    if undone:
        for preemption in undone:
            cycle.preempted.discard(preemption.victim)
            cycle.holdings.hold(cycle.evicted[preemption.victim])
        del cycle.preemptions[mark:]


class Refusal(NamedTuple):
    """Why a gang is not admitted: the reason, and the member's decision and quota blocks behind it."""

    reason: str
    decision: Decision
    blocks: list[Block]


def _place(cycle: AdmissionState, members: Sequence[Waiting]) -> list[tuple[Waiting, Allocation]] | Refusal:
    """Every member placed in turn on the fleet as the earlier members left it, under its tenant's quota
    with the earlier members counted; on the first that does not fit, the earlier ones are given back."""
    placed: list[tuple[Waiting, Allocation]] = []
    for member in members:
        decision, blocks = cycle.trials.try_admit(member)
        if decision.allocation is None:
            decision, blocks = _why(cycle, member, decision, blocks)
            for earlier, _ in reversed(placed):
                cycle.withdraw(earlier)
            return Refusal(f"member {member.name} does not fit: {decision.reason}", decision, blocks)
        cycle.admit(member, decision.allocation)
        placed.append((member, decision.allocation))
    return placed


def _place_on_one_value(cycle: AdmissionState, unit: GangUnit, members: Sequence[Waiting], key: str
                        ) -> list[tuple[Waiting, Allocation]] | Refusal:
    """The members on the nodes of one value of node label `key`, the values with the most free devices
    (that the first member's first request accepts) tried first; those with fewer than the gang needs
    are not tried when every member has the same spec."""
    domains = cycle.gangs.domains.of(cycle.fleet, key)
    facts = unit_facts(cycle, unit)
    need = facts.need
    if not domains:
        return Refusal(f"gang {unit.name} needs {need} GPUs on one {key}; no node has the label {key}",
                       UNANSWERED, [])
    free, ordered = cycle.gangs.domains.free_ordered(cycle.placement, members[0], domains)
    if facts.alike is None:
        facts.alike = len({id(m.claim) for m in members}) == 1 or len({_spec(cycle, m) for m in members}) == 1
    alike = facts.alike
    most = free[ordered[0]]  # the most free (ordered_values puts it first)
    last: Refusal | None = None
    if facts.usable is None:  # fixed for the fleet: worked out once per unit
        facts.usable = usable_nodes(cycle.placement, members)
    usable = facts.usable
    for value in ordered:
        if alike and free[value] < need:
            break  # the rest have fewer still
        with confined(cycle.placement, cycle.fleet, domains[value], usable):
            outcome = _place(cycle, members)
        if not isinstance(outcome, Refusal):
            return outcome
        last = outcome if last is None else last
    reason = f"gang {unit.name} needs {need} GPUs on one {key}; the most free on one is {most}"
    if last is not None:
        reason += f" ({last.reason} on the one with the most)"
    return Refusal(reason, last.decision if last else UNANSWERED, last.blocks if last else [])


def _spec(cycle: AdmissionState, member: Waiting) -> int:
    return id(cycle.placement.plan(member.claim))


def _may_split(cycle: AdmissionState, unit: GangUnit) -> bool:
    """With `preferred`, a gang may be split across values once it has waited its gang-topology-wait
    for room in one since it was complete (at once without a clock: simulate's every wait is over)."""
    if unit.settings.mode != "preferred":
        return False
    now = cycle.snapshot.now
    if now is None or unit.settings.wait <= 0:
        return True
    since = cycle.gangs.complete_since.setdefault(unit.key, now)
    return now - since >= unit.settings.wait


def _why(cycle: AdmissionState, member: Waiting, decision: Decision, blocks: list[Block]
         ) -> tuple[Decision, list[Block]]:
    """The member's reason, worked out while the earlier members still hold what they took."""
    if decision is UNANSWERED or (decision.state is State.PENDING and decision.reason is None):
        return cycle.answers.answer(member, decision, blocks)
    return decision, blocks


def _refused(cycle: AdmissionState, unit: GangUnit, refusal: Refusal) -> list[Decided]:
    """Every member's answer when the gang is not admitted: Pending, with the reason."""
    reason, decision, blocks = refusal
    if not reason.startswith(f"gang {unit.name} "):
        reason = f"gang {unit.name}: {reason}"
    told = Decision(State.PENDING, reason=reason, unsatisfiable=decision.unsatisfiable, cut=decision.cut)
    gangs = cycle.gangs
    if decision.cut:
        return [(m, told, blocks) for m in unit.members]
    if gangs.told_alike(unit, reason):
        return []  # every member was told this reason, its numbers aside
    answers = [(m, told, blocks) for m in unit.members if gangs.due(m, reason, numbers_may_lag=True)]
    gangs.note_told(unit, reason)
    return answers
