"""A waiting gang with a topology key preempts as it is placed: all of it on one value of the key (victims
only on that value's nodes), or nothing; a `preferred` gang whose wait is over may take victims on any
value. Rows over a fleet of two cliques of two 4-GPU nodes, full of one-node claims of lower priority."""

from __future__ import annotations

import pytest

from shared.admission.cycle import run_cycle
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.results import Allocation, DeviceResult
from tests.builders import a_claim, fleet, labelled, node

CLIQUES = labelled(fleet(*node("a1", "H100", 4), *node("a2", "H100", 4), *node("b1", "H100", 4),
                         *node("b2", "H100", 4)),
                   {"a1": {"clique": "c1"}, "a2": {"clique": "c1"}, "b1": {"clique": "c2"}, "b2": {"clique": "c2"}})


def holder(node_name: str, order: int, *, preemptible: bool = True) -> Running:
    devices = tuple(DeviceResult("gpu", "gpu.nvidia.com", node_name, f"gpu-{i}") for i in range(4))
    return Running("t", f"on-{node_name}", Allocation(node_name, devices), 0, preemptible, allocated_order=order)


def member(name: str, mode: str = "required") -> Waiting:
    builder = a_claim(name, "t").request(count=4).gang("g", 2, topology="clique", mode=mode)
    builder.annotations["claimbroker.io/priority"] = "10"
    return Waiting("t", name, builder.build(), 10, True, 100)


@pytest.mark.parametrize(("mode", "fixed", "victims"), [
    ("required", (), [("on-a1", "on-a2"), ("on-b1", "on-b2")]),  # one clique's two nodes, either
    ("required", ("a1", "b2"), []),  # each clique keeps a node that may not be preempted: nothing moves
    ("required", ("a1",), [("on-b1", "on-b2")]),  # only c2 can be freed whole
    ("preferred", ("a1", "b2"), [("on-a2", "on-b1")]),  # no wait: split across the cliques
], ids=["either-clique", "no-clique-can-be-freed", "the-clique-that-can", "preferred-splits"])
def test_a_topology_gang_preempts_on_one_value_or_not_at_all(mode: str, fixed: tuple[str, ...],
                                                             victims: list[tuple[str, ...]]) -> None:
    running = tuple(holder(n, i, preemptible=n not in fixed) for i, n in enumerate(("a1", "a2", "b1", "b2"), 1))
    waiting = (member("m1", mode), member("m2", mode))
    result = run_cycle(Snapshot(CLIQUES, BUILTIN_CLASSES, QuotaConfig(), running, waiting))
    taken = tuple(sorted(p.victim[1] for p in result.preemptions))
    states = {d.name: d.decision.state.value for d in result.decisions}
    if not victims:
        assert taken == () and states == {"m1": "Pending", "m2": "Pending"}
        return
    assert taken in victims, taken
    nodes = {d.decision.allocation.node for d in result.decisions if d.decision.allocation is not None}
    assert states == {"m1": "Allocated", "m2": "Allocated"} and nodes == {t.removeprefix("on-") for t in taken}
