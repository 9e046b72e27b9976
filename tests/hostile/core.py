"""The decision core as the allocator runs it, over the built-in fleet, for hostile claims: one cycle with a
hostile claim and a normal one next to it, on a fleet where six claims of another tenant already run."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import ClaimDecision, Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
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


def decide_with_companion(claim: dra.ResourceClaim, memo: KeptState,
                          running: tuple[Running, ...]) -> dict[str, Any]:
    """One cycle: the claim, then a normal one-GPU claim of tenant t1. What happened, as plain data:
    the claim's outcome (allocated, pending, rejected, internal-error, missing), its reason, the
    companion's state and reason, and problems (reasons missing, other claims with internal errors)."""
    hostile = waiting(claim, 1001)
    companion = waiting(read_submission(normal_claim(COMPANION), TENANT), 1002)
    cycle = run_cycle(Snapshot(FLEET, DEVICE_CLASSES, QUOTAS, running, (hostile, companion)), memo)
    decided = {(d.tenant, d.name): d for d in cycle.decisions}
    problems = reason_problems(cycle.decisions)
    mine, theirs = decided.get(hostile.key), decided.get(companion.key)
    if mine is None:
        problems.append("the hostile claim got no decision")
        outcome = "missing"
    else:
        outcome = "internal-error" if internal_error(mine) else mine.decision.state.value.lower()
    problems += [f"{d.tenant}/{d.name}: {d.decision.reason}" for d in cycle.decisions
                 if internal_error(d) and (d.tenant, d.name) != hostile.key]
    return {"outcome": outcome, "reason": (mine.decision.reason or "")[:500] if mine else None,
            "companion": theirs.decision.state.value if theirs else None,
            "companion_reason": theirs.decision.reason if theirs else None, "problems": problems}
