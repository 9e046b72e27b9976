"""A member released before its gang formed: the others' count goes down and says so, the released member
holds nothing, and a member submitted again under its name completes the gang, through the cycle the
allocator runs (the kept state across cycles)."""

from __future__ import annotations

from dataclasses import replace

from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import CycleResult, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.dra.classes import BUILTIN_CLASSES
from tests.builders import a_claim, fleet, node

FLEET = fleet(*node("n1", "H100", 4), *node("n2", "H100", 4), *node("n3", "H100", 4))


def member(name: str, arrival: int) -> Waiting:
    claim = a_claim(name, "t").request(count=4).gang("g", 3).build()
    return Waiting("t", name, claim, 0, True, arrival)


def decide(kept: KeptState, *waiting: Waiting) -> CycleResult:
    return run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, QuotaConfig(), (), waiting), kept)


def test_a_member_released_before_the_gang_formed() -> None:
    kept = KeptState()
    a, b = member("a", 0), member("b", 1)
    first = decide(kept, a, b)
    assert {d.name: d.decision.reason for d in first.decisions} == {"a": "gang g: 2 of 3 members received",
                                                                    "b": "gang g: 2 of 3 members received"}
    a, b = replace(a, answered=True), replace(b, answered=True)
    after_release = decide(kept, b)  # a released: it leaves the queue
    assert {d.name: d.decision.reason for d in after_release.decisions} == {"b": "gang g: 1 of 3 members received"}
    b = replace(b, answered=True)
    c = member("c", 2)
    still = decide(kept, b, c)  # two of three again: nothing allocated, though three nodes are free
    assert {d.name: d.decision.state.value for d in still.decisions} == {"b": "Pending", "c": "Pending"}
    b, c = replace(b, answered=True), replace(c, answered=True)
    again = member("a", 3)  # submitted again under its name: the gang is whole, one member a node
    whole = decide(kept, b, c, again)
    allocated = {d.name: d.decision.allocation.node for d in whole.decisions if d.decision.allocation is not None}
    assert sorted(allocated) == ["a", "b", "c"] and len(set(allocated.values())) == 3


def test_a_waiting_gang_is_not_told_again_when_only_its_numbers_move() -> None:
    """A complete gang that does not fit, answered: the next cycle, with other numbers in its reason (a
    claim took a device), tells its members nothing; asked again (the allocator's reason refresh), they get
    the new numbers."""
    from shared.admission.model import Running
    from shared.dra.results import Allocation, DeviceResult

    kept = KeptState()
    a, b, c = member("a", 0), member("b", 1), member("c", 2)  # 12 GPUs on 12: a 1-GPU holder keeps it out
    held = Running("u", "one", Allocation("n3", (DeviceResult("gpu", "gpu.nvidia.com", "n3", "gpu-0"),)))

    def decide_with(*waiting: Waiting, running: tuple[Running, ...] = (held,)) -> CycleResult:
        return run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, QuotaConfig(), running, waiting), kept)

    first = decide_with(a, b, c)
    told = {d.name: d.decision.reason for d in first.decisions}
    assert set(told) == {"a", "b", "c"} and "free 3" in (told["a"] or ""), told
    a, b, c = (replace(w, answered=True) for w in (a, b, c))
    more = Running("u", "two", Allocation("n3", (DeviceResult("gpu", "gpu.nvidia.com", "n3", "gpu-1"),)))
    assert decide_with(a, b, c, running=(held, more)).decisions == ()  # free 2 now: the same words
    asked = decide_with(*(replace(w, answered=False) for w in (a, b, c)), running=(held, more))
    assert {d.name: d.decision.reason for d in asked.decisions}["a"] != told["a"]
