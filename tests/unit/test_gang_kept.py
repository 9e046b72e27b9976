"""What a cycle keeps of gangs so that its cost follows what changed (issue 38, Speed): a gang with a topology
key that did not fit is not tried again while nothing its trial reads changed, and is once it does; the free
devices per topology value are counted again when devices are taken or freed. Driven through run_cycle."""

from __future__ import annotations

from dataclasses import replace

from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import CycleResult, Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.dra.results import Allocation, DeviceResult
from tests.builders import a_claim, fleet, labelled, node

CLIQUE = "nvidia.com/gpu.clique"


def cliques(*groups: tuple[str, list[tuple[str, int]]]) -> Fleet:
    """Nodes of H100s per clique: (clique, [(node, GPUs), ...])."""
    f = fleet(*(d for _, nodes in groups for name, count in nodes for d in node(name, "H100", count)))
    return labelled(f, {name: {CLIQUE: clique} for clique, nodes in groups for name, _ in nodes})


def member(name: str, *, count: int = 4, arrival: int = 0, mode: str | None = None) -> Waiting:
    claim = a_claim(name, "t").request(count=count).gang("g", 2, topology=CLIQUE, mode=mode).build()
    return Waiting("t", name, claim, 0, True, arrival)


def blocker(f: Fleet, name: str, count: int, on: str) -> Running:
    """A running claim of another tenant on the first `count` devices of node `on` (not preemptible)."""
    devices = f.nodes[on].devices[:count]
    allocation = Allocation(on, tuple(DeviceResult("gpu", d.driver, d.pool, d.name) for d in devices))
    return Running("u", name, allocation, preemptible=False)


def states(result: CycleResult) -> dict[str, str]:
    return {d.name: d.decision.state.value for d in result.decisions}


def reasons(result: CycleResult) -> dict[str, str]:
    return {d.name: d.decision.reason or "" for d in result.decisions}


def test_a_topology_gang_that_did_not_fit_is_kept_as_refused_and_tried_again_as_devices_free() -> None:
    """Clique A (a1, a2) and B (b1, b2) of 4 GPUs each, a1 and b1 half taken: the gang of 2 x 4 finds 6 free
    on the clique with the most. Nothing changes: no answer, and its refusal is the one kept. One blocker
    ends: 8 free on clique A, the gang goes there."""
    f = cliques(("A", [("a1", 4), ("a2", 4)]), ("B", [("b1", 4), ("b2", 4)]))
    busy = (blocker(f, "x", 2, "a1"), blocker(f, "y", 2, "b1"))
    gang = (member("m1"), member("m2", arrival=1))
    kept = KeptState()
    first = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), busy, gang), kept)
    refused = "gang g needs 8 GPUs on one nvidia.com/gpu.clique; the most free on one is 6"
    assert reasons(first) == {"m1": refused, "m2": refused}
    state = kept.admission
    assert state is not None and ("t", "g") in state.gangs.failed_at  # kept: a topology gang too
    answered = tuple(replace(m, answered=True) for m in gang)
    again = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), busy, answered), kept)
    assert again.decisions == ()
    freed = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), busy[1:], answered), kept)
    assert states(freed) == {"m1": "Allocated", "m2": "Allocated"}, reasons(freed)
    assert {d.decision.allocation.node for d in freed.decisions if d.decision.allocation} == {"a1", "a2"}


def test_the_free_devices_per_value_follow_what_is_taken_and_freed() -> None:
    """The most free on one clique, as the refusal says it, after a blocker comes and after it goes."""
    f = cliques(("A", [("a1", 4), ("a2", 4)]), ("B", [("b1", 4)]))
    gang = (member("m1", count=8), member("m2", count=8, arrival=1))  # never fits: 16 on one clique
    kept = KeptState()

    def most(running: tuple[Running, ...]) -> str:
        result = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), running, gang), kept)
        return reasons(result)["m1"].rsplit(" ", 1)[-1]

    assert most(()) == "8"
    assert most((blocker(f, "x", 3, "a2"),)) == "5"
    assert most((blocker(f, "x", 3, "a2"), blocker(f, "y", 2, "a1"))) == "4"  # B's 4 now the most
    assert most(()) == "8"


def test_a_preferred_gang_whose_wait_runs_is_not_kept_as_refused() -> None:
    """Its refusal holds only until its wait is over: it is tried each cycle, and split once the wait ends."""
    f = cliques(("A", [("a1", 4), ("a2", 2)]), ("B", [("b1", 4), ("b2", 2)]))
    claims = [a_claim(n, "t").request(count=4).gang("g", 2, topology=CLIQUE, mode="preferred", wait="1m").build()
              for n in ("m1", "m2")]
    gang = (Waiting("t", "m1", claims[0], 0, True, 0), Waiting("t", "m2", claims[1], 0, True, 1))
    kept = KeptState()
    first = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), gang, now=100.0), kept)
    assert states(first) == {"m1": "Pending", "m2": "Pending"}
    state = kept.admission
    assert state is not None and ("t", "g") not in state.gangs.failed_at
    answered = tuple(replace(m, answered=True) for m in gang)
    split = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), answered, now=160.0), kept)
    assert states(split) == {"m1": "Allocated", "m2": "Allocated"}
