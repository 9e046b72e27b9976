"""Gangs: claims admitted all or nothing. The annotations (read by settings_of), then the cycle's rules,
each a table row driven through public entry points."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import CycleResult, Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig, QuotaFileError, parse_quotas
from shared.dra.claims import GangSettings, InvalidClaim, settings_of
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.dra.results import State
from tests.builders import a_claim, fleet, labelled, node


@pytest.mark.parametrize(("annotations", "gang"), [
    ({}, None),
    ({"claimbroker.io/gang": "train-7", "claimbroker.io/gang-size": "4"}, GangSettings("train-7", 4)),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "1"}, GangSettings("g", 1)),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "256"}, GangSettings("g", 256)),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2",
      "claimbroker.io/gang-topology": "nvidia.com/gpu.clique"}, GangSettings("g", 2, "nvidia.com/gpu.clique")),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "rack",
      "claimbroker.io/gang-topology-mode": "preferred", "claimbroker.io/gang-topology-wait": "1h30m"},
     GangSettings("g", 2, "rack", "preferred", 5400.0)),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "rack",
      "claimbroker.io/gang-topology-wait": "0"}, GangSettings("g", 2, "rack")),
])
def test_gang_annotations_read(annotations: dict[str, str], gang: GangSettings | None) -> None:
    claim = a_claim().request().build()
    claim.metadata.annotations.update(annotations)
    assert settings_of(claim).gang == gang


@pytest.mark.parametrize(("annotations", "names"), [
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "0"}, ['gang-size', '"0"', '1 to 256']),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "257"}, ["gang-size", '"257"']),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "abc"}, ["gang-size", '"abc"']),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "-1"}, ["gang-size", '"-1"']),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "٣"}, ["gang-size"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": " 4"}, ["gang-size"]),
    ({"claimbroker.io/gang": "g"}, ["gang-size", "is required"]),
    ({"claimbroker.io/gang": "Train_7", "claimbroker.io/gang-size": "4"}, ["claimbroker.io/gang]", '"Train_7"',
                                                                          "DNS label"]),
    ({"claimbroker.io/gang": "", "claimbroker.io/gang-size": "4"}, ["claimbroker.io/gang]", "DNS label"]),
    ({"claimbroker.io/gang": "a" * 64, "claimbroker.io/gang-size": "4"}, ["claimbroker.io/gang]"]),
    ({"claimbroker.io/gang-size": "4"}, ["gang-size", "only with claimbroker.io/gang"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "bad key/x/y"},
     ["gang-topology", "node label key"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "-rack"},
     ["gang-topology"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "rack",
      "claimbroker.io/gang-topology-mode": "strict"}, ["gang-topology-mode", '"strict"', "required"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology": "rack",
      "claimbroker.io/gang-topology-wait": "5 minutes"}, ["gang-topology-wait", '"5 minutes"', "duration"]),
    ({"claimbroker.io/gang": "g", "claimbroker.io/gang-size": "2", "claimbroker.io/gang-topology-mode": "preferred"},
     ["gang-topology-mode", "only with claimbroker.io/gang-topology"]),
])
def test_bad_gang_annotations_reject_the_claim_naming_annotation_and_value(annotations: dict[str, str],
                                                                          names: list[str]) -> None:
    claim = a_claim().request().build()
    claim.metadata.annotations.update(annotations)
    with pytest.raises(InvalidClaim) as raised:
        settings_of(claim)
    for name in names:
        assert name in str(raised.value)


# ---- the cycle: all or nothing ----------------------------------------------------------------------------

def member(name: str, gang: str = "g", size: int | str = 2, *, tenant: str = "t", count: int = 1,
           priority: int = 0, arrival: int = 0, topology: str | None = None, selectors: tuple[str, ...] = ()
           ) -> Waiting:
    claim = a_claim(name, tenant).request(count=count, selectors=selectors).gang(gang, size, topology=topology).build()
    return Waiting(tenant, name, claim, priority, True, arrival)


def plain(name: str, *, tenant: str = "t", count: int = 1, priority: int = 0, arrival: int = 0) -> Waiting:
    claim = a_claim(name, tenant).request(count=count).build()
    return Waiting(tenant, name, claim, priority, True, arrival)


def quotas(*tenants: dict[str, Any]) -> QuotaConfig:
    return parse_quotas({"kind": "Quotas", "tenants": list(tenants)})


def cycle(f: Fleet, waiting: list[Waiting], config: QuotaConfig | None = None,
          running: tuple[Running, ...] = ()) -> CycleResult:
    return run_cycle(Snapshot(f, BUILTIN_CLASSES, config or QuotaConfig(), running, tuple(waiting)))


def states(result: CycleResult) -> dict[str, str]:
    return {d.name: d.decision.state.value for d in result.decisions}


def reasons(result: CycleResult) -> dict[str, str]:
    return {d.name: d.decision.reason or "" for d in result.decisions}


@dataclass
class GangCase:
    fleet: Fleet
    waiting: list[Waiting]
    expect: dict[str, str]  # claim name -> state
    reason: dict[str, str] = field(default_factory=dict)  # claim name -> a substring of its reason
    quotas: QuotaConfig = field(default_factory=QuotaConfig)
    same_node: tuple[str, ...] = ()  # claims allocated on one node


TWO_NODES = fleet(*node("n1", "H100", 4), *node("n2", "H100", 4))
GANG_CASES = {
    "incomplete-gang-holds-nothing": GangCase(
        TWO_NODES, [member("a", size=3, count=4), member("b", size=3, count=4, arrival=1),
                    plain("solo", count=4, arrival=2), plain("solo2", count=4, arrival=3)],
        {"a": "Pending", "b": "Pending", "solo": "Allocated", "solo2": "Allocated"},
        {"a": "gang g: 2 of 3 members received", "b": "gang g: 2 of 3 members received"}),
    "complete-gang-admitted-whole": GangCase(
        TWO_NODES, [member("a", count=4), member("b", count=4, arrival=1)], {"a": "Allocated", "b": "Allocated"}),
    "members-share-a-node-with-room": GangCase(
        TWO_NODES, [member("a", count=2), member("b", count=2, arrival=1)], {"a": "Allocated", "b": "Allocated"},
        same_node=("a", "b")),
    "a-gang-that-does-not-fit-holds-nothing": GangCase(
        fleet(*node("n1", "H100", 4), *node("n2", "H100", 2)),
        [member("a", count=4), member("b", count=4, arrival=1), plain("solo", count=4, arrival=2)],
        {"a": "Pending", "b": "Pending", "solo": "Allocated"},  # solo first: the gang ranks at its share after
        {"a": "gang g: member a does not fit: Insufficient nvidia.com/gpu: requested 4, free 2",
         "b": "gang g: member a does not fit: "}),
    "a-gang-that-does-not-fit-leaves-its-devices-to-others": GangCase(
        fleet(*node("n1", "H100", 4), *node("n2", "H100", 2)),
        [member("a", count=4), member("b", count=4, arrival=1), plain("solo", tenant="u", count=4, arrival=2)],
        {"a": "Pending", "b": "Pending", "solo": "Allocated"}),
    "quota-counts-every-member": GangCase(
        TWO_NODES, [member("a", count=3), member("b", count=3, arrival=1)], {"a": "Pending", "b": "Pending"},
        {"a": "gang g: member b does not fit: Quota", "b": "gang g: member b does not fit: Quota"},
        quotas({"name": "t", "quotas": {"H100": {"nominal": 4, "borrowingLimit": 0}}})),
    "a-member-with-another-size-is-rejected": GangCase(
        TWO_NODES, [member("a"), member("b", size=3, arrival=1)], {"a": "Pending", "b": "Rejected"},
        {"b": "gang g: its gang-size 3 disagrees with 2 stated by its first member a", "a": "1 of 2"}),
    "one-member-too-many-is-rejected": GangCase(
        TWO_NODES, [member("a"), member("b", arrival=1), member("c", arrival=2)],
        {"a": "Allocated", "b": "Allocated", "c": "Rejected"}, {"c": "one more than its gang-size"}),
    "a-topology-key-on-some-members-only-is-rejected": GangCase(
        TWO_NODES, [member("a"), member("b", topology="rack", arrival=1)], {"a": "Pending", "b": "Rejected"},
        {"b": "its gang-topology rack disagrees with (none)"}),
    "the-same-gang-name-in-two-tenants-is-two-gangs": GangCase(
        TWO_NODES, [member("a", tenant="x"), member("b", tenant="y", arrival=1)], {"a": "Pending", "b": "Pending"},
        {"a": "1 of 2", "b": "1 of 2"}),
    "two-interleaved-gangs-that-fit-one-at-a-time": GangCase(
        TWO_NODES, [member("a1", "ga", count=4), member("b1", "gb", count=4, arrival=1),
                    member("a2", "ga", count=4, arrival=2), member("b2", "gb", count=4, arrival=3)],
        {"a1": "Allocated", "a2": "Allocated", "b1": "Pending", "b2": "Pending"},
        {"b1": "gang gb: member b", "b2": "gang gb: member b"}),
    "a-gang-of-one": GangCase(TWO_NODES, [member("a", size=1, count=4)], {"a": "Allocated"}),
    "invalid-gang-annotation-rejects-in-the-core-too": GangCase(
        TWO_NODES, [member("a", size=0)], {"a": "Rejected"}, {"a": "gang-size"}),
}


@pytest.mark.parametrize("case", GANG_CASES.values(), ids=GANG_CASES.keys())
def test_gang_cycle(case: GangCase) -> None:
    result = cycle(case.fleet, case.waiting, case.quotas)
    assert states(result) == case.expect, reasons(result)
    for name, part in case.reason.items():
        assert part in reasons(result)[name], reasons(result)[name]
    if case.same_node:
        nodes = {d.decision.allocation.node for d in result.decisions
                 if d.name in case.same_node and d.decision.allocation is not None}
        assert len(nodes) == 1


def test_two_interleaved_gangs_of_two_tenants_never_hold_half_each() -> None:
    """Whatever the arrival order and tenants, one gang is whole and the other holds nothing."""
    waiting = [member("a1", "ga", tenant="x", count=4), member("b1", "gb", tenant="y", count=4, arrival=1),
               member("b2", "gb", tenant="y", count=4, arrival=2), member("a2", "ga", tenant="x", count=4, arrival=3)]
    result = cycle(TWO_NODES, waiting)
    allocated = {d.name for d in result.decisions if d.decision.allocation is not None}
    assert allocated in ({"a1", "a2"}, {"b1", "b2"}), states(result)
    assert allocated == {"b1", "b2"}  # gb was complete first (fair share ties; then arrival of its last member)


def test_a_gang_is_placed_at_its_tenants_share_after_admitting_it_whole() -> None:
    """Tenants x and y both at share 0: x's gang of 2 x 2 H100 ranks at share 8 (four H100 of 2 units),
    so y's claim of 1 H100 goes first and the gang no longer fits on the node of 4."""
    config = quotas({"name": "x"}, {"name": "y"})
    f = fleet(*node("n1", "H100", 4))
    waiting = [member("a", tenant="x", count=2), member("b", tenant="x", count=2, arrival=1),
               plain("solo", tenant="y", arrival=5)]
    result = cycle(f, waiting, config)
    assert states(result) == {"a": "Pending", "b": "Pending", "solo": "Allocated"}, reasons(result)


def test_a_gangs_priority_is_its_highest_members() -> None:
    """Two gangs of one tenant that fit one at a time: the one with a high-priority member goes first."""
    waiting = [member("a1", "ga", count=4), member("a2", "ga", count=4, arrival=1),
               member("b1", "gb", count=4, arrival=2), member("b2", "gb", count=4, priority=5, arrival=3)]
    result = cycle(TWO_NODES, waiting)
    assert states(result) == {"a1": "Pending", "a2": "Pending", "b1": "Allocated", "b2": "Allocated"}


def test_an_incomplete_gang_is_told_again_only_when_its_count_changes() -> None:
    kept = KeptState()
    a = member("a", size=3)
    first = run_cycle(Snapshot(TWO_NODES, BUILTIN_CLASSES, QuotaConfig(), (), (a,)), kept)
    assert reasons(first) == {"a": "gang g: 1 of 3 members received"}
    a = replace(a, answered=True)
    again = run_cycle(Snapshot(TWO_NODES, BUILTIN_CLASSES, QuotaConfig(), (), (a,)), kept)
    assert again.decisions == ()
    b = member("b", size=3, arrival=1)
    more = run_cycle(Snapshot(TWO_NODES, BUILTIN_CLASSES, QuotaConfig(), (), (a, b)), kept)
    assert reasons(more) == {"a": "gang g: 2 of 3 members received", "b": "gang g: 2 of 3 members received"}


def test_a_gang_that_fails_gives_back_what_its_earlier_members_took() -> None:
    """The gang (share 12 after) goes before u (share 16): a takes 3 of n1, b finds no node with 3, so a's
    devices are given back in the same pass and u's claim of 4 gets n1 (u's big claim may not be preempted)."""
    f = fleet(*node("n1", "H100", 4), *node("n2", "H100", 2), *node("n3", "H100", 8))
    big = plain("big", tenant="u", count=8)
    kept = KeptState()
    first = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), (big,)), kept)
    [allocated] = first.decisions
    assert allocated.decision.allocation is not None
    running = (Running("u", "big", allocated.decision.allocation, preemptible=False, allocated_order=1),)
    waiting = (member("a", count=3, arrival=1), member("b", count=3, arrival=2),
               plain("solo", tenant="u", count=4, arrival=3))
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), running, waiting), kept)
    assert states(result) == {"a": "Pending", "b": "Pending", "solo": "Allocated"}, reasons(result)
    assert reasons(result)["a"].startswith("gang g: member b does not fit: Insufficient nvidia.com/gpu")
    [solo] = [d for d in result.decisions if d.name == "solo"]
    assert solo.decision.allocation is not None and solo.decision.allocation.node == "n1"


# ---- topology ------------------------------------------------------------------------------------------

CLIQUE = "nvidia.com/gpu.clique"


def cliques(*groups: tuple[str, list[tuple[str, int]]]) -> Fleet:
    """Nodes of H100s per clique: (clique, [(node, GPUs), ...])."""
    f = fleet(*(d for _, nodes in groups for name, count in nodes for d in node(name, "H100", count)))
    return labelled(f, {name: {CLIQUE: clique} for clique, nodes in groups for name, _ in nodes})


def on_nodes(result: CycleResult) -> dict[str, str]:
    return {d.name: d.decision.allocation.node for d in result.decisions if d.decision.allocation is not None}


def test_required_topology_puts_every_member_on_one_value() -> None:
    f = cliques(("A", [("a1", 4), ("a2", 2)]), ("B", [("b1", 4), ("b2", 4)]))
    result = cycle(f, [member("m1", count=4, topology=CLIQUE), member("m2", count=4, topology=CLIQUE, arrival=1)])
    assert set(on_nodes(result).values()) == {"b1", "b2"}, reasons(result)


def test_required_topology_tries_the_value_with_the_most_free_first() -> None:
    f = cliques(("A", [("a1", 4), ("a2", 4)]), ("B", [("b1", 4), ("b2", 4), ("b3", 4)]))
    result = cycle(f, [member("m1", count=4, topology=CLIQUE), member("m2", count=4, topology=CLIQUE, arrival=1)])
    assert {n[0] for n in on_nodes(result).values()} == {"b"}


def test_required_topology_that_no_value_holds_names_the_numbers() -> None:
    f = cliques(("A", [("a1", 4), ("a2", 2)]), ("B", [("b1", 4), ("b2", 2)]))
    waiting = [member("m1", count=4, topology=CLIQUE), member("m2", count=4, topology=CLIQUE, arrival=1)]
    result = cycle(f, waiting)
    assert states(result) == {"m1": "Pending", "m2": "Pending"}
    assert reasons(result)["m1"] == "gang g needs 8 GPUs on one nvidia.com/gpu.clique; the most free on one is 6"


def test_required_topology_without_the_label_on_any_node() -> None:
    waiting = [member("m1", count=1, topology="rack"), member("m2", count=1, topology="rack", arrival=1)]
    result = cycle(TWO_NODES, waiting)
    assert reasons(result)["m1"] == "gang g needs 2 GPUs on one rack; no node has the label rack"


def test_a_value_with_room_whose_nodes_cannot_hold_a_member_is_explained() -> None:
    """Clique A has 8 free but on nodes of 2: a member of 4 does not fit there."""
    f = cliques(("A", [("a1", 2), ("a2", 2), ("a3", 2), ("a4", 2)]))
    waiting = [member("m1", count=4, topology=CLIQUE), member("m2", count=4, topology=CLIQUE, arrival=1)]
    reason = reasons(cycle(f, waiting))["m1"]
    assert reason.startswith("gang g needs 8 GPUs on one nvidia.com/gpu.clique; the most free on one is 8 "
                             "(member m1 does not fit: Insufficient nvidia.com/gpu"), reason


def preferred(name: str, wait: str | None = None, arrival: int = 0) -> Waiting:
    claim = a_claim(name, "t").request(count=4).gang("g", 2, topology=CLIQUE, mode="preferred", wait=wait).build()
    return Waiting("t", name, claim, 0, True, arrival)


def test_preferred_topology_with_no_wait_splits_when_no_value_holds_the_gang() -> None:
    f = cliques(("A", [("a1", 4), ("a2", 2)]), ("B", [("b1", 4), ("b2", 2)]))
    result = cycle(f, [preferred("m1"), preferred("m2", arrival=1)])
    assert states(result) == {"m1": "Allocated", "m2": "Allocated"}


def test_preferred_topology_keeps_to_one_value_when_one_holds_it() -> None:
    f = cliques(("A", [("a1", 4), ("a2", 2)]), ("B", [("b1", 4), ("b2", 4)]))
    result = cycle(f, [preferred("m1"), preferred("m2", arrival=1)])
    assert set(on_nodes(result).values()) == {"b1", "b2"}


def test_preferred_topology_waits_its_wait_before_splitting() -> None:
    f = cliques(("A", [("a1", 4), ("a2", 2)]), ("B", [("b1", 4), ("b2", 2)]))
    kept = KeptState()
    waiting = (preferred("m1", "1h"), preferred("m2", "1h", arrival=1))
    first = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), waiting, now=1000.0), kept)
    assert states(first) == {"m1": "Pending", "m2": "Pending"}
    assert "the most free on one is 6" in reasons(first)["m1"]
    later = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), waiting, now=1000.0 + 3599), kept)
    assert all(d.decision.allocation is None for d in later.decisions)
    split = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), waiting, now=1000.0 + 3600), kept)
    assert states(split) == {"m1": "Allocated", "m2": "Allocated"}


# ---- preemption of whole gangs -------------------------------------------------------------------------

def running_gang(f: Fleet, members: list[Waiting], *, orders: tuple[int, ...] = (),
                 not_preemptible: tuple[str, ...] = ()) -> tuple[Running, ...]:
    """The members admitted by a cycle, as the shell would run them (their gang read from their documents)."""
    result = cycle(f, members)
    by_name = {m.name: m for m in members}
    out = []
    for i, d in enumerate(result.decisions):
        assert d.decision.allocation is not None, reasons(result)
        gang = settings_of(by_name[d.name].claim).gang
        out.append(Running(d.tenant, d.name, d.decision.allocation, 0, d.name not in not_preemptible,
                           allocated_order=orders[i] if orders else i + 1, gang=gang.name if gang else None))
    return tuple(out)


def test_preempting_one_member_preempts_its_whole_gang() -> None:
    gang = running_gang(TWO_NODES, [member("m1", count=4), member("m2", count=4, arrival=1)])
    result = cycle(TWO_NODES, [plain("urgent", count=4, priority=10, arrival=5)], running=gang)
    assert states(result) == {"urgent": "Allocated"}
    assert sorted((p.victim[1], p.rule) for p in result.preemptions) == [("m1", "priority"), ("m2", "priority")]
    assert all("with every member of its gang g" in p.reason for p in result.preemptions)


def test_a_victim_sets_cost_counts_the_whole_gang() -> None:
    """A gang member and a plain claim hold 4 GPUs each on their nodes: the gang frees 8 in all, so the
    plain claim is the cheaper victim, though the gang's members were allocated more recently."""
    f = fleet(*node("n1", "H100", 4), *node("n2", "H100", 4), *node("n3", "H100", 4))
    first = cycle(f, [plain("p", count=4), member("m1", count=4, arrival=1), member("m2", count=4, arrival=2)])
    allocations = {d.name: d.decision.allocation for d in first.decisions if d.decision.allocation is not None}
    assert len(allocations) == 3, reasons(first)
    running = (Running("t", "p", allocations["p"], allocated_order=1),
               Running("t", "m1", allocations["m1"], allocated_order=5, gang="g"),
               Running("t", "m2", allocations["m2"], allocated_order=6, gang="g"))
    result = cycle(f, [plain("urgent", count=4, priority=10, arrival=9)], running=running)
    assert [p.victim[1] for p in result.preemptions] == ["p"]


def test_a_gang_with_a_member_that_may_not_be_preempted_is_no_victim() -> None:
    gang = running_gang(TWO_NODES, [member("m1", count=4), member("m2", count=4, arrival=1)],
                        not_preemptible=("m2",))
    result = cycle(TWO_NODES, [plain("urgent", count=4, priority=10, arrival=5)], running=gang)
    assert states(result) == {"urgent": "Pending"} and result.preemptions == ()


def test_a_gang_with_a_member_of_higher_priority_than_the_preemptor_is_no_victim() -> None:
    gang = running_gang(TWO_NODES, [member("m1", count=4), member("m2", count=4, arrival=1)])
    gang = (gang[0], replace(gang[1], priority=20))
    result = cycle(TWO_NODES, [plain("urgent", count=4, priority=10, arrival=5)], running=gang)
    assert states(result) == {"urgent": "Pending"} and result.preemptions == ()


def two_running(*, second_preemptible: bool = True) -> tuple[Running, ...]:
    first = cycle(TWO_NODES, [plain("p1", count=4), plain("p2", count=4, arrival=1)])
    done = {d.name: d.decision.allocation for d in first.decisions if d.decision.allocation is not None}
    return (Running("t", "p1", done["p1"], allocated_order=1),
            Running("t", "p2", done["p2"], preemptible=second_preemptible, allocated_order=2))


def test_a_waiting_gang_preempts_when_every_member_then_fits() -> None:
    gang = [member("m1", count=4, priority=10, arrival=5), member("m2", count=4, priority=10, arrival=6)]
    result = cycle(TWO_NODES, gang, running=two_running())
    assert states(result) == {"m1": "Allocated", "m2": "Allocated"}, reasons(result)
    assert sorted(p.victim[1] for p in result.preemptions) == ["p1", "p2"]


def test_a_waiting_gang_that_would_not_be_whole_preempts_nothing() -> None:
    gang = [member("m1", count=4, priority=10, arrival=5), member("m2", count=4, priority=10, arrival=6)]
    result = cycle(TWO_NODES, gang, running=two_running(second_preemptible=False))
    assert states(result) == {"m1": "Pending", "m2": "Pending"}
    assert result.preemptions == ()
    assert reasons(result)["m1"].startswith("gang g: member m")


# ---- property: no gang is ever half admitted -----------------------------------------------------------

@st.composite
def gang_scenarios(draw: st.DrawFn) -> tuple[Fleet, list[list[Waiting]]]:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    f = fleet(*(d for i, count in enumerate(sizes) for d in node(f"n{i}", "H100", count)))
    claims: list[Waiting] = []
    for g in range(draw(st.integers(0, 3))):
        size = draw(st.integers(1, 3))
        tenant = draw(st.sampled_from(["x", "y"]))
        for m in range(size):
            claims.append(member(f"g{g}m{m}", f"g{g}", size, tenant=tenant, count=draw(st.integers(1, 3)),
                                 priority=draw(st.integers(0, 2))))
    for p in range(draw(st.integers(0, 4))):
        claims.append(plain(f"p{p}", tenant=draw(st.sampled_from(["x", "y"])), count=draw(st.integers(1, 3)),
                            priority=draw(st.integers(0, 2))))
    claims = draw(st.permutations(claims))
    cuts = sorted(draw(st.lists(st.integers(0, len(claims)), max_size=2)))
    waves = [claims[a:b] for a, b in zip([0, *cuts], [*cuts, len(claims)], strict=True)]
    return f, waves


@settings(max_examples=60, deadline=None)
@given(gang_scenarios())
def test_no_gang_is_ever_half_admitted_or_half_preempted(scenario: tuple[Fleet, list[list[Waiting]]]) -> None:
    f, waves = scenario
    kept = KeptState()
    running: dict[tuple[str, str], Running] = {}
    queue: dict[tuple[str, str], Waiting] = {}
    gang_of = {w.key: settings_of(w.claim).gang for wave in waves for w in wave}
    arrival = 0
    for wave in waves:
        for w in wave:
            arrival += 1
            queue[w.key] = replace(w, arrival=arrival)
        for _ in range(3):
            result = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), tuple(running.values()),
                                        tuple(queue.values())), kept)
            allocated = {(d.tenant, d.name) for d in result.decisions if d.decision.allocation is not None}
            by_gang: dict[tuple[str, str], set[tuple[str, str]]] = {}
            for key in allocated:
                if (gang := gang_of[key]) is not None:
                    by_gang.setdefault((key[0], gang.name), set()).add(key)
            for (tenant, name), got in by_gang.items():
                size = next(g.size for k, g in gang_of.items() if g is not None and (k[0], g.name) == (tenant, name))
                assert len(got) == size, (name, got)
            victims = {p.victim: p.by for p in result.preemptions}
            for key in victims:
                if (gang := gang_of[key]) is not None:
                    mates = {k for k, r in running.items() if r.gang == gang.name and k[0] == key[0]}
                    assert mates <= set(victims), (key, mates, victims)
            for key in victims:
                victim = running.pop(key)
                queue[key] = replace(_original(waves, key), arrival=victim.arrival,
                                     displaced_by=frozenset({victims[key]}))
            for d in result.decisions:
                key = (d.tenant, d.name)
                if key not in queue:
                    continue
                w = queue[key]
                if d.decision.allocation is not None:
                    gang = gang_of[key]
                    running[key] = Running(w.tenant, w.name, d.decision.allocation, w.priority, True, w.arrival,
                                           len(running) + arrival, gang=gang.name if gang else None)
                    del queue[key]
                elif d.decision.state is State.REJECTED:
                    del queue[key]
                else:
                    queue[key] = replace(w, answered=True)
            held = [k for r in running.values() for k in r.allocation.keys]
            assert len(held) == len(set(held))


def _original(waves: list[list[Waiting]], key: tuple[str, str]) -> Waiting:
    return next(w for wave in waves for w in wave if w.key == key)


# ---- gangReserveAfter ----------------------------------------------------------------------------------

def starving(reserve_after: str, ticks: int = 40) -> int | None:
    """A full fleet of y's 1-GPU claims (not preemptible), one finishing and one more arriving every 100 s
    (round the nodes), and x's gang of 2 x 4 GPUs: the tick its gang is admitted at, or None."""
    f = fleet(*(d for i in range(4) for d in node(f"n{i}", "H100", 4)))
    config = quotas({"name": "x", "gangReserveAfter": reserve_after}, {"name": "y"})
    kept = KeptState()
    queue = {w.key: w for w in [plain(f"y{i}", tenant="y", arrival=i) for i in range(16)]}
    running: dict[tuple[str, str], Running] = {}
    gang = [member("m1", tenant="x", count=4, arrival=100), member("m2", tenant="x", count=4, arrival=101)]
    now, arrival = 0.0, 200
    for tick in range(ticks):
        result = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, tuple(running.values()), tuple(queue.values()),
                                    now=now), kept)
        for d in result.decisions:
            w = queue.get((d.tenant, d.name))
            if w is not None and d.decision.allocation is not None:
                running[w.key] = Running(w.tenant, w.name, d.decision.allocation, preemptible=w.tenant == "x",
                                         allocated_order=arrival, gang="g" if w.tenant == "x" else None)
                del queue[w.key]
            elif w is not None:
                queue[w.key] = replace(w, answered=True)
        if ("x", "m1") in running:
            assert ("x", "m2") in running
            return tick
        if tick == 0:
            queue.update({m.key: m for m in gang})
            continue
        node_name = f"n{tick % 4}"  # one of y's claims on this node finishes; another arrives
        done = next((k for k, r in sorted(running.items()) if k[0] == "y" and r.allocation.node == node_name), None)
        if done is not None:
            del running[done]
        arrival += 1
        queue[("y", f"more{tick}")] = plain(f"more{tick}", tenant="y", arrival=arrival)
        now += 100.0
    return None


def test_a_gang_behind_a_stream_of_small_claims_waits_forever_without_gang_reserve_after() -> None:
    assert starving("0s") is None


def test_with_gang_reserve_after_the_gang_keeps_what_frees_and_is_admitted() -> None:
    tick = starving("5m")
    assert tick is not None and tick <= 30, tick


def test_gang_reserve_after_is_read_from_the_quotas_file() -> None:
    config = quotas({"name": "x", "gangReserveAfter": "10m"}, {"name": "y"}, {"name": "z", "gangReserveAfter": "0s"})
    assert (config.gang_reserve_after("x"), config.gang_reserve_after("y"), config.gang_reserve_after("z")) == (
        600.0, 300.0, 0.0)
    assert config.tenants["x"].to_json()["gangReserveAfter"] == "10m"
    with pytest.raises(QuotaFileError, match="gangReserveAfter"):
        quotas({"name": "x", "gangReserveAfter": "soon"})


def test_a_member_rejected_by_its_own_cel_is_named_to_the_others() -> None:
    broken = a_claim("b", "t").request(selectors=("device.attributes['gpu.nvidia.com'].nosuch == 1",)).gang("g", 2)
    kept = KeptState()
    a = member("a")
    b = Waiting("t", "b", broken.build(), arrival=1)
    first = run_cycle(Snapshot(TWO_NODES, BUILTIN_CLASSES, QuotaConfig(), (), (a, b)), kept)
    assert states(first) == {"a": "Pending", "b": "Rejected"}, reasons(first)
    assert reasons(first)["a"].startswith("gang g: 1 of 2 members received (b Rejected")
    later = run_cycle(Snapshot(TWO_NODES, BUILTIN_CLASSES, QuotaConfig(), (), (replace(a, answered=True),)), kept)
    assert later.decisions == ()  # the same answer: not given again
    state = kept.admission
    assert state is not None
    run_cycle(Snapshot(TWO_NODES, BUILTIN_CLASSES, QuotaConfig(), (), ()), kept)
    assert state.gangs.lost == {} and state.gangs.gangs == {}  # nothing kept once the gang has left


def test_incomplete_gangs_that_did_not_change_cost_a_cycle_nothing() -> None:
    """2,000 incomplete gangs: once answered, a cycle reads no gang (none changed) and answers none."""
    f = fleet(*node("n", "H100", 8))
    waiting = tuple(member(f"m{i}", f"g{i}", 2, tenant=f"t{i % 20}", arrival=i) for i in range(2000))
    kept = KeptState()
    assert len(run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), waiting), kept).decisions) == 2000
    waiting = tuple(replace(w, answered=True) for w in waiting)
    assert run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), waiting), kept).decisions == ()
    state = kept.admission
    assert state is not None
    complete, changed = state.gangs.units()
    assert (complete, changed) == ([], [])


def test_required_topology_with_members_of_different_specs_keeps_them_all_on_one_value() -> None:
    """Clique B has the most free H100s but too few B200s for m2: both go to clique A."""
    b200 = 'device.attributes["gpu.nvidia.com"].productName == "B200"'
    f = labelled(fleet(*node("h1", "H100", 4), *node("b1", "B200", 4), *node("h2", "H100", 4),
                       *node("h3", "H100", 4), *node("b2", "B200", 2)),
                 {"h1": {CLIQUE: "A"}, "b1": {CLIQUE: "A"}, "h2": {CLIQUE: "B"}, "h3": {CLIQUE: "B"},
                  "b2": {CLIQUE: "B"}})
    h100 = 'device.attributes["gpu.nvidia.com"].productName == "H100"'
    waiting = [member("m1", count=4, topology=CLIQUE, selectors=(h100,)),
               member("m2", count=4, topology=CLIQUE, selectors=(b200,), arrival=1)]
    result = cycle(f, waiting)
    assert on_nodes(result) == {"m1": "h1", "m2": "b1"}, reasons(result)


def test_a_gang_that_did_not_fit_is_tried_again_once_devices_free() -> None:
    kept = KeptState()
    busy = cycle(TWO_NODES, [plain("p", tenant="u", count=4)]).decisions[0].decision.allocation
    assert busy is not None
    running = (Running("u", "p", busy, preemptible=False),)
    gang = (member("a", count=4), member("b", count=4, arrival=1))
    first = run_cycle(Snapshot(TWO_NODES, BUILTIN_CLASSES, QuotaConfig(), running, gang), kept)
    assert states(first) == {"a": "Pending", "b": "Pending"}
    answered = tuple(replace(m, answered=True) for m in gang)
    again = run_cycle(Snapshot(TWO_NODES, BUILTIN_CLASSES, QuotaConfig(), running, answered), kept)
    assert again.decisions == ()
    freed = run_cycle(Snapshot(TWO_NODES, BUILTIN_CLASSES, QuotaConfig(), (), answered), kept)
    assert states(freed) == {"a": "Allocated", "b": "Allocated"}
