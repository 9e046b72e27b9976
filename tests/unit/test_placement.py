"""Placement rules beyond DRA's first fit, DynamicMIG topologies, the CEL guards, and counters under random
waves: table rows name the rule they show."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.dra import cel_runtime
from shared.dra.allocation import FleetState, decide, settle
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import THROTTLED, UNHEALTHY, Fleet, NodeInventory
from shared.dra.results import State
from shared.fleet.sources import documents_from
from tests.builders import a_claim, fleet, gpu, node


def topology(*nodes: dict[str, Any]) -> Fleet:
    docs = documents_from([{"kind": "Topology", "nodes": list(nodes)}], "test")
    return Fleet.from_slices(docs.slices, docs.labels)


def with_health(f: Fleet, node_name: str, device: str, health: str) -> Fleet:
    inventory = f.nodes[node_name]
    devices = tuple(replace(d, health=health) if d.name == device else d for d in inventory.devices)
    return f.with_node(NodeInventory(node=node_name, devices=devices, counters=inventory.counters))


MEMORY_20G = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("20Gi")) >= 0'


@pytest.mark.parametrize(("name", "f", "claim", "node", "device"), [
    ("smallest-adequate-device: a 20 GB job takes an A100-40GB before an H200",
     fleet(*node("h200", "H200", 1), *node("a40", "A100-40GB", 1)),
     a_claim().request(selectors=(MEMORY_20G,)), "a40", "gpu-0"),
    ("a 19 GiB MIG job takes the 2-slice 1g.20gb (19.6 GiB), not a 3g",
     topology({"name": "m", "gpuModel": "H100", "gpuCount": 1, "mig": {0: ["3g.40gb", "1g.20gb", "1g.20gb"]}}),
     a_claim().request(cls="mig.nvidia.com", selectors=(MEMORY_20G.replace("20Gi", "19Gi"),)), "m",
     "gpu-0-mig-1g20gb-15-4"),
    ("throttled devices come last",
     with_health(fleet(*node("n", "H100", 2)), "n", "gpu-0", THROTTLED),
     a_claim().request(), "n", "gpu-1"),
    ("a dynamic 1g slice leaves the 4g placement (slots 0-3) free",
     topology({"name": "d", "gpuModel": "H100", "gpuCount": 1, "mig": {0: "dynamic"}}),
     a_claim().request(cls="mig.nvidia.com", selectors=(
         'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',)), "d", "gpu-0-mig-1g10gb-19-6"),
])
def test_best_fit(name: str, f: Fleet, claim: Any, node: str, device: str) -> None:
    decision = decide(claim.build(), f, BUILTIN_CLASSES, ())
    assert decision.allocation is not None, decision.reason
    assert (decision.allocation.node, decision.allocation.results[0].device) == (node, device), name


def test_unhealthy_devices_and_stale_nodes_are_never_used() -> None:
    f = with_health(fleet(*node("sick", "H100", 1), *node("old", "H100", 1)), "sick", "gpu-0", UNHEALTHY)
    state = FleetState(f, BUILTIN_CLASSES, (), unusable_nodes={"old": "inventory 200s old, over the 90s TTL"})
    decision = state.decide(a_claim().request().build())
    assert decision.state is State.PENDING
    assert decision.reason == ("Insufficient nvidia.com/gpu: requested 1, free 0 of 2 on 2 nodes "
                               "(1 on nodes with stale inventory, 1 unhealthy)")


def test_dynamic_mig_publishes_counters_and_a_whole_gpu_excludes_its_partitions() -> None:
    f = topology({"name": "d", "gpuModel": "H100", "gpuCount": 1, "mig": {0: "dynamic"}})
    names = {d.name for d in f.devices}
    assert {"gpu-0", "gpu-0-mig-7g80gb-0-0", "gpu-0-mig-3g40gb-9-4", "gpu-0-mig-1g10gbme-20-6"} <= names
    assert f.nodes["d"].counters[("gpu.nvidia.com", "d", "gpu-0-counter-set", "memory-slice-7")].value == 1
    whole = a_claim("whole").request().build()
    part = a_claim("part").request(cls="mig.nvidia.com").build()
    outcomes = settle([whole, part], f, BUILTIN_CLASSES, ())
    assert [o.decision.state for o in outcomes] == [State.ALLOCATED, State.PENDING]
    assert "blocked by shared counters" in (outcomes[1].decision.reason or "")


def test_two_3g_slices_fill_a_gpu_and_the_third_waits() -> None:
    f = topology({"name": "d", "gpuModel": "H100", "gpuCount": 1, "mig": {0: "dynamic"}})
    three_g = 'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"'
    claims = [a_claim(f"s{i}").request(cls="mig.nvidia.com", selectors=(three_g,)).build() for i in range(3)]
    outcomes = settle(claims, f, BUILTIN_CLASSES, ())
    assert [o.decision.state for o in outcomes] == [State.ALLOCATED, State.ALLOCATED, State.PENDING]


@pytest.mark.parametrize(("expression", "message"), [
    ("[" + ",".join(map(str, range(200))) + "].all(a, [" + ",".join(map(str, range(200))) + "].all(b, a != b))",
     "too complex: estimated cost"),
    ("x" * 10_241, "over the limit of 10240"),
])
def test_expensive_expressions_are_refused(expression: str, message: str) -> None:
    claim = a_claim().request(selectors=(expression,))
    try:
        decision = decide(claim.build(), fleet(*node("n", "H100", 1)), BUILTIN_CLASSES, ())
    except Exception as error:  # the 10 Ki limit is a schema error: the claim does not even parse
        assert message in str(error)
        return
    assert decision.state is State.REJECTED and message in (decision.reason or "")


def test_a_runaway_evaluation_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cel_runtime, "EVALUATION_TIME_LIMIT_S", 0.01)
    items = ",".join(map(str, range(120)))
    slow = f"[{items}].all(a, [{items}].all(b, a + b >= 0))"  # under the cost limit, still slow in Python
    decision = decide(a_claim().request(selectors=(slow,)).build(), fleet(gpu("n", 0)), BUILTIN_CLASSES, ())
    assert decision.state is State.REJECTED and "stopped after" in (decision.reason or "")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", None]),
                          st.integers(1, 2)), min_size=1, max_size=12))
def test_shared_counters_are_never_exceeded(requests: list[tuple[str | None, int]]) -> None:
    f = topology({"name": "d", "gpuModel": "H100", "gpuCount": 2, "mig": {0: "dynamic", 1: "dynamic"}})
    claims = []
    for i, (profile, count) in enumerate(requests):
        if profile is None:
            claims.append(a_claim(f"c{i}").request(count=count).build())
        else:
            claims.append(a_claim(f"c{i}").request(cls="mig.nvidia.com", count=count, selectors=(
                f'device.attributes["gpu.nvidia.com"].profile == "{profile}"',)).build())
    outcomes = settle(claims, f, BUILTIN_CLASSES, ())
    used: dict[Any, int] = {}
    taken: set[Any] = set()
    for outcome in outcomes:
        if outcome.decision.allocation is None:
            continue
        for key in outcome.decision.allocation.keys:
            assert key not in taken
            taken.add(key)
            for counter, amount in f.by_key[key].counter_draws:
                used[counter] = used.get(counter, 0) + amount
    counters = f.nodes["d"].counters
    assert all(used[c] <= counters[c].value for c in used), "a shared counter was over-subscribed"
