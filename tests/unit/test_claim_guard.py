"""Poison isolation in the decision core: a claim whose deciding fails never stops the others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from shared.admission import cycle
from shared.admission.answers import Answers
from shared.admission.claim_guard import ClaimFault
from shared.admission.cycle import run_cycle
from shared.admission.explain import Explainer
from shared.admission.kept import KeptState
from shared.admission.model import CycleResult, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.admission.trial_admission import TrialAdmission
from shared.dra import allocation
from shared.dra import model as dra
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.results import State
from tests.builders import a_claim, fleet, gpu, node

FLEET = fleet(*node("h100", "H100", 4), *node("b200", "B200", 4))
MISSING_KEY = 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'


def waiting(name: str, *selectors: str, count: int = 1, arrival: int = 0) -> Waiting:
    claim = a_claim(name, "team").request(count=count, selectors=selectors).build()
    return Waiting("team", name, claim, arrival=arrival)


GOOD = [waiting(f"good-{i}", count=2, arrival=i) for i in range(3)]


def states(result: CycleResult) -> dict[str, tuple[str, Any]]:
    return {d.name: (d.decision.state.value, d.decision.allocation) for d in result.decisions}


def decide(claims: list[Waiting], kept: KeptState | None = None) -> CycleResult:
    return run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, QuotaConfig(), (), tuple(claims)), kept)


def _is_poison(value: Any) -> bool:
    if isinstance(value, Waiting):
        return value.name == "poison"
    return isinstance(value, dra.ResourceClaim) and value.metadata.name == "poison"


def failing(function: Callable[..., Any], error: BaseException) -> Callable[..., Any]:
    """The function, failing when handed the claim named `poison`."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if any(_is_poison(a) for a in args):
            raise error
        return function(*args, **kwargs)

    return wrapper


# Where deciding a claim can fail: reading its spec (when it joins the queue), a placement, its
# answer, its explanation.
STEPS = {
    "plan": (allocation.FleetState, "plan"),
    "placement": (TrialAdmission, "decide"),
    "answer": (Answers, "answer"),
    "explanation": (Explainer, "pending"),
}


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize(("error", "state", "internal"), [
    (ZeroDivisionError("division by zero"), "Pending", True),
    (KeyError("missing"), "Pending", True),
    (RecursionError("maximum recursion depth exceeded"), "Rejected", False),
])
def test_a_failing_claim_gets_its_outcome_and_the_others_decide_as_without_it(
        monkeypatch: pytest.MonkeyPatch, step: str, error: BaseException, state: str, internal: bool) -> None:
    poison = waiting("poison", count=8, arrival=-1)  # first in line, and it waits: answered and explained
    without = states(decide(GOOD))
    owner, name = STEPS[step]
    monkeypatch.setattr(owner, name, failing(getattr(owner, name), error))

    result = decide([poison, *GOOD])

    decided = {d.name: d for d in result.decisions}
    assert decided["poison"].decision.state.value == state
    assert decided["poison"].decision.reason
    assert (decided["poison"].internal_error is not None) is internal
    assert {k: v for k, v in states(result).items() if k != "poison"} == without


def test_a_selector_failing_on_a_device_rejects_the_claim_with_the_device_named() -> None:
    result = decide([waiting("poison", MISSING_KEY, arrival=-1), *GOOD])

    decided = {d.name: d.decision for d in result.decisions}
    assert decided["poison"].state is State.REJECTED
    reason = decided["poison"].reason or ""
    assert "no such member" in reason and "gpu.nvidia.com/" in reason
    assert all(decided[w.name].state is State.ALLOCATED for w in GOOD)


def test_a_selector_that_fails_only_on_a_device_arriving_later_rejects_the_waiting_claim_then() -> None:
    """Valid on the first fleet (its devices have the attribute the selector reads); a node whose devices
    lack it arrives, and the claim already waiting is Rejected in the next cycle, the others decided."""
    memo = KeptState()
    reads_cc = 'device.attributes["gpu.nvidia.com"].cudaComputeCapability == "10.0"'
    with_attribute = fleet(*[gpu("b200", i, "B200", cudaComputeCapability="10.0") for i in range(2)])
    big = waiting("big", reads_cc, count=8)
    first = run_cycle(Snapshot(with_attribute, BUILTIN_CLASSES, QuotaConfig(), (), (big,)), memo)
    assert first.decisions[0].decision.state is State.PENDING

    grown = fleet(*with_attribute.devices, *node("h100", "H100", 4))
    answered = replace(big, answered=True)
    later = run_cycle(Snapshot(grown, BUILTIN_CLASSES, QuotaConfig(), (), (answered, GOOD[0])), memo)

    decided = {d.name: d.decision for d in later.decisions}
    assert decided["big"].state is State.REJECTED and "h100" in (decided["big"].reason or "")
    assert decided[GOOD[0].name].state is State.ALLOCATED


def test_a_cycle_that_fails_for_every_claim_raises_instead_of_looping(monkeypatch: pytest.MonkeyPatch) -> None:
    def always(self: Any, claim: Waiting, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken")

    monkeypatch.setattr(cycle, "MAX_FAULTS_PER_CYCLE", 2)
    monkeypatch.setattr(TrialAdmission, "decide", always)
    with pytest.raises(ClaimFault):
        decide(GOOD)


def test_kept_state_is_built_anew_after_a_fault_so_the_next_cycle_agrees_with_a_fresh_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    memo = KeptState()
    original = TrialAdmission.decide
    monkeypatch.setattr(TrialAdmission, "decide", failing(original, ZeroDivisionError("boom")))
    decide([waiting("poison", arrival=-1), *GOOD[:1]], memo)
    monkeypatch.setattr(TrialAdmission, "decide", original)

    later = [*GOOD[1:], waiting("late", count=4, arrival=9)]
    assert states(decide(later, memo)) == states(decide(later))
