"""Cycles until the queue settles, as the allocator would run them over its next cycles: what `simulate`,
what-if and the hostile-claim checks run, each applying a cycle's result to its own record of what runs
and what waits.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import CycleResult, Snapshot

# Cycles that only go on with placement work the budget cut short (shared/dra/budget.py), as the allocator
# runs them: what settles is what the allocator would give once that work is done.
MAX_GOING_ON = 10_000


def run_until_settled(snapshot: Callable[[], Snapshot], kept: KeptState, apply: Callable[[CycleResult], bool], *,
                      most_changing: int, most_going_on: int = MAX_GOING_ON) -> None:
    """Run cycles on `snapshot()` (what runs and waits now) until one changes nothing. `apply` does what
    the allocator does with a cycle's result (admitted claims run, Rejected ones leave the queue, Pending
    ones are answered, preempted ones wait again) and says whether the next cycle may decide otherwise (a
    claim admitted or preempted). A cycle that changes nothing but left placement work its budget cut
    short (`deferred`) is followed by another, as the allocator's next cycles go on with that work. At
    most `most_changing` cycles that change something and `most_going_on` that only go on."""
    changing = going_on = 0
    while changing < most_changing and going_on < most_going_on:
        result = run_cycle(snapshot(), kept)
        if apply(result):
            changing += 1
        elif result.deferred:
            going_on += 1
        else:
            break
