"""The clocks of waiting gangs outlive the admission state that runs them: what the allocator keeps
(services/allocator/gang_clocks.ClockedKeptState) and restores into a state built anew, through
WaitingGangs.marks and restore. The ledger's side is tests/integration/test_gang_ledger.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.allocator.gang_clocks import ClockedKeptState
from shared.admission.cycle import run_cycle
from shared.admission.gangs import GangKey, GangMark
from shared.admission.model import Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from tests.unit.test_gangs import cliques, member, preferred, states

# two cliques of 6: a gang of 2 x 4 fits in neither, so a `preferred` one splits once its wait is over
SPLIT_ONLY = cliques(("A", [("a1", 4), ("a2", 2)]), ("B", [("b1", 4), ("b2", 2)]))
GANG = (preferred("m1", "1h"), preferred("m2", "1h", arrival=1))


def decide(kept: ClockedKeptState, now: float, waiting: tuple[Waiting, ...] = GANG,
           f: Fleet = SPLIT_ONLY) -> dict[str, str]:
    return states(run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), waiting, now=now), kept))


@dataclass
class Case:
    marks: dict[GangKey, GangMark]  # kept from before the state was built
    expect: str  # m1's state at 1000 + 3600
    left: dict[GangKey, GangMark]  # the marks after that cycle


CASES = {
    "wait-counted-from-before": Case({("t", "g"): (1000.0, None)}, "Allocated", {}),
    # first in its tenant's order from now too (gangReserveAfter's clock)
    "nothing-kept-the-wait-starts-now": Case({}, "Pending", {("t", "g"): (4600.0, 4600.0)}),
    "another-tenants-gang-is-not-this-one": Case({("u", "g"): (1000.0, None)}, "Pending",
                                                 {("t", "g"): (4600.0, 4600.0)}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_state_built_anew_starts_with_the_kept_clocks(case: Case) -> None:
    kept = ClockedKeptState(marks=case.marks)
    assert decide(kept, 1000.0 + 3600) == {"m1": case.expect, "m2": case.expect}
    assert kept.admission is not None
    assert dict(kept.admission.gangs.marks(kept.admission.admitted_now)) == case.left


def test_the_clocks_survive_a_state_built_anew_within_one_process() -> None:
    kept = ClockedKeptState()
    assert decide(kept, 1000.0) == {"m1": "Pending", "m2": "Pending"}
    assert kept.admission is not None
    kept.marks = kept.admission.gangs.marks()
    assert dict(kept.marks) == {("t", "g"): (1000.0, 1000.0)}
    kept.forget_cycle()  # as after a claim's fault; another fleet or quotas build it anew as well
    assert decide(kept, 1000.0 + 3600) == {"m1": "Allocated", "m2": "Allocated"}


def test_an_incomplete_gangs_clock_is_not_restored() -> None:
    """A member left while the clock was kept: the gang starts again when it is complete again."""
    kept = ClockedKeptState(marks={("t", "g"): (1000.0, 1000.0)})
    assert decide(kept, 2000.0, (GANG[0],)) == {"m1": "Pending"}
    assert kept.admission is not None and dict(kept.admission.gangs.marks()) == {}


def test_marks_leave_out_gangs_admitted_in_the_cycle_and_cost_nothing_without_clocks() -> None:
    fits = cliques(("A", [("a1", 4), ("a2", 4)]))
    kept = ClockedKeptState()
    waiting = (member("m1", count=4), member("m2", count=4, arrival=1))
    assert decide(kept, 1000.0, waiting, fits) == {"m1": "Allocated", "m2": "Allocated"}
    state = kept.admission
    assert state is not None
    assert dict(state.gangs.marks()) == {} and dict(state.gangs.marks(state.admitted_now)) == {}
    state.gangs.first_since[("t", "g")] = 900.0  # as a gang admitted after a wait leaves it until it runs
    assert dict(state.gangs.marks()) == {("t", "g"): (None, 900.0)}
    assert dict(state.gangs.marks(state.admitted_now)) == {}
