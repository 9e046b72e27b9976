"""The decision core as the allocator runs it, over the built-in fleet, for hostile claims: a hostile claim
and a normal one queued together, decided in the cycles the allocator runs for them (a claim whose placement
work its budget cut short is answered in a later cycle), on a fleet where six claims of another tenant
already run."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import ClaimDecision, CycleResult, Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.admission.settling import run_until_settled
from shared.dra import model as dra
from shared.dra.claims import read_submission, settings_of
from shared.dra.classes import merge_classes
from shared.dra.inventory import Fleet
from shared.dra.results import State
from shared.fleet.sources import BUILTIN_TOPOLOGY, documents_from
from tests.hostile.corpus import TENANT, normal_claim

MAX_REASON = 16 * 1024  # a reason that quotes a huge input cannot be published (NATS caps messages at 1 MiB)
COMPANION = "companion"

_DOCUMENTS = documents_from([BUILTIN_TOPOLOGY], "built-in fleet")
FLEET = Fleet.from_slices(_DOCUMENTS.slices, _DOCUMENTS.labels)
DEVICE_CLASSES = merge_classes(_DOCUMENTS.classes)
QUOTAS = QuotaConfig()


def waiting(claim: dra.ResourceClaim, arrival: int) -> Waiting:
    settings = settings_of(claim)
    return Waiting(claim.metadata.namespace or "default", claim.metadata.name, claim, settings.priority,
                   settings.preemptible, arrival)


def busy_fleet(memo: KeptState) -> tuple[Running, ...]:
    """Six low-priority claims of tenant t0 running (preemption victims for hostile priorities), after the
    cycles that placed them: `memo` then holds what an allocator's memo holds between cycles."""
    claims = [waiting(read_submission(normal_claim(f"busy-{i}"), "t0"), i + 1) for i in range(6)]
    cycle = run_cycle(Snapshot(FLEET, DEVICE_CLASSES, QUOTAS, (), tuple(claims)), memo)
    decided = {(d.tenant, d.name): d.decision for d in cycle.decisions}
    running = []
    for order, claim in enumerate(claims, start=1):
        allocation = decided[claim.key].allocation
        assert allocation is not None, decided[claim.key]
        running.append(Running(claim.tenant, claim.name, allocation, -5, True, claim.arrival, order))
    warm = waiting(read_submission(normal_claim("warm"), TENANT), 100)
    run_cycle(Snapshot(FLEET, DEVICE_CLASSES, QUOTAS, tuple(running), (warm,)), memo)
    return tuple(running)


def internal_error(decided: ClaimDecision) -> bool:
    """The core's guard contained an exception of its own while deciding this claim."""
    return bool(getattr(decided, "internal_error", None)) or (decided.decision.reason or "").startswith(
        "internal error")


def reason_problems(decisions: Iterable[ClaimDecision]) -> list[str]:
    """Rejected and Pending claims say why, in a sentence that can be published."""
    problems = []
    for d in decisions:
        if d.decision.state in (State.REJECTED, State.PENDING):
            if not d.decision.reason:
                problems.append(f"{d.tenant}/{d.name} is {d.decision.state.value} without a reason")
            elif len(d.decision.reason) > MAX_REASON:
                problems.append(f"{d.tenant}/{d.name}'s reason is {len(d.decision.reason):,} characters")
    return problems


MAX_CYCLES = 64  # more than the budget's patience (CUT_PATIENCE) with room: a claim still unanswered is a defect


def settle(running: tuple[Running, ...], queue: tuple[Waiting, ...], memo: KeptState) -> list[ClaimDecision]:
    """Cycles as the allocator runs them until nothing is left to go on with: allocated claims run, rejected
    ones leave the queue, pending ones stay answered, and a cycle whose budget cut work short is followed by
    another. Every decision made, in order (a claim's last one counts)."""
    running_now, waiting = list(running), {w.key: w for w in queue}
    decisions: list[ClaimDecision] = []

    def snapshot() -> Snapshot:
        return Snapshot(FLEET, DEVICE_CLASSES, QUOTAS, tuple(running_now), tuple(waiting.values()))

    def apply(cycle: CycleResult) -> bool:
        decisions.extend(cycle.decisions)
        for d in cycle.decisions:
            queued = waiting.get((d.tenant, d.name))
            if queued is None:
                continue
            if d.decision.allocation is not None:
                running_now.append(Running(queued.tenant, queued.name, d.decision.allocation, queued.priority,
                                           queued.preemptible, queued.arrival, len(running_now) + 1))
                del waiting[queued.key]
            elif d.decision.state is State.REJECTED:
                del waiting[queued.key]
            else:
                waiting[queued.key] = replace(queued, answered=True)
        return False  # what is checked is each claim's answer: the run ends once no work was cut short

    run_until_settled(snapshot, memo, apply, most_changing=1, most_going_on=MAX_CYCLES)
    return decisions


def decide_with_companion(claim: dra.ResourceClaim, memo: KeptState,
                          running: tuple[Running, ...]) -> dict[str, Any]:
    """The claim, then a normal one-GPU claim of tenant t1, settled. What happened, as plain data:
    the claim's outcome (allocated, pending, rejected, internal-error, missing), its reason, the
    companion's state and reason, and problems (reasons missing, other claims with internal errors)."""
    hostile = waiting(claim, 1001)
    companion = waiting(read_submission(normal_claim(COMPANION), TENANT), 1002)
    decisions = settle(running, (hostile, companion), memo)
    decided = {(d.tenant, d.name): d for d in decisions}
    problems = reason_problems(decisions)
    mine, theirs = decided.get(hostile.key), decided.get(companion.key)
    if mine is None:
        problems.append("the hostile claim got no decision")
        outcome = "missing"
    else:
        outcome = "internal-error" if internal_error(mine) else mine.decision.state.value.lower()
    problems += [f"{d.tenant}/{d.name}: {d.decision.reason}" for d in decisions
                 if internal_error(d) and (d.tenant, d.name) != hostile.key]
    return {"outcome": outcome, "reason": (mine.decision.reason or "")[:500] if mine else None,
            "companion": theirs.decision.state.value if theirs else None,
            "companion_reason": theirs.decision.reason if theirs else None, "problems": problems}
