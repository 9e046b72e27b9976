"""Cycles until the queue settles (shared/admission/settling.py): until a cycle changes nothing, going on
while placement work was cut short, within the limits given."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.admission import settling
from shared.admission.kept import KeptState
from shared.admission.model import CycleResult, Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.admission.settling import run_until_settled
from shared.dra.classes import BUILTIN_CLASSES
from tests.builders import a_claim, fleet, node

FLEET = fleet(*node("n", "H100", 2))


def test_cycles_run_until_one_admits_nothing() -> None:
    claims = [Waiting("t", f"c{i}", a_claim(f"c{i}", "t").request(count=1).build(), arrival=i) for i in range(3)]
    running: dict[tuple[str, str], Running] = {}
    waiting = {w.key: w for w in claims}
    results: list[CycleResult] = []

    def snapshot() -> Snapshot:
        return Snapshot(FLEET, BUILTIN_CLASSES, QuotaConfig(), tuple(running.values()), tuple(waiting.values()))

    def apply(result: CycleResult) -> bool:
        results.append(result)
        changed = False
        for d in result.decisions:
            queued = waiting[(d.tenant, d.name)]
            if d.decision.allocation is not None:
                running[queued.key] = Running(queued.tenant, queued.name, d.decision.allocation,
                                              arrival=queued.arrival, allocated_order=len(running) + 1)
                del waiting[queued.key]
                changed = True
            else:
                waiting[queued.key] = replace(queued, answered=True)
        return changed

    run_until_settled(snapshot, KeptState(), apply, most_changing=8)

    assert sorted(running) == [("t", "c0"), ("t", "c1")]
    assert len(results) == 2  # the second cycle admits nothing: the queue has settled


@pytest.mark.parametrize(("changed", "deferred", "cycles"), [
    (True, 0, 3),  # every cycle changes something: at most `most_changing`
    (False, 1, 5),  # work cut short every cycle: at most `most_going_on`
    (False, 0, 1),  # nothing changed, nothing left to go on with
])
def test_the_limits_bound_the_cycles(monkeypatch: pytest.MonkeyPatch, changed: bool, deferred: int,
                                     cycles: int) -> None:
    ran: list[int] = []

    def cycle(snapshot: Snapshot, kept: KeptState) -> CycleResult:
        ran.append(1)
        return CycleResult((), (), {}, deferred)

    monkeypatch.setattr(settling, "run_cycle", cycle)
    empty = Snapshot(FLEET, BUILTIN_CLASSES, QuotaConfig(), (), ())
    run_until_settled(lambda: empty, KeptState(), lambda result: changed, most_changing=3, most_going_on=5)

    assert len(ran) == cycles
