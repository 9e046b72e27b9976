"""The pure allocator, table-driven: each row a scenario from the DRA catalogue or our placement rules."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from shared.dra import model as dra
from shared.dra.allocation import decide, settle
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.dra.results import Decision, State
from tests.builders import ClaimBuilder, a_claim, fleet, gpu, node

H100 = 'device.attributes["gpu.nvidia.com"].productName == "H100"'


@dataclass
class Case:
    claim: ClaimBuilder
    fleet: Fleet
    state: State
    node: str | None = None
    devices: tuple[str, ...] | None = None
    reason: str | None = None  # a substring the reason must contain
    in_use: frozenset[tuple[str, str, str]] = field(default_factory=frozenset)
    checked: bool = True  # False: read shape-only, as the allocator re-reads a stored claim (parsing refuses it)


CASES = {
    "simple": Case(a_claim().request(), fleet(*node("n1", "H100", 2)), State.ALLOCATED, "n1", ("gpu-0",)),
    "count-two": Case(a_claim().request(count=2), fleet(*node("n1", "H100", 2)), State.ALLOCATED, "n1",
                      ("gpu-0", "gpu-1")),
    "no-node-big-enough": Case(
        a_claim().request(count=3), fleet(*node("n1", "H100", 2), *node("n2", "H100", 2)), State.PENDING,
        reason="requested 3, free 4 of 4 on 2 nodes; no node has 3 such devices (most: 2), so it cannot be "
               "placed until the fleet changes"),
    "not-enough-free-on-one-node": Case(
        a_claim().request(count=3), fleet(*node("n1", "H100", 3), *node("n2", "H100", 2)), State.PENDING,
        reason="requested 3, free 4 of 5 on 2 nodes; at most 2 free on any one node",
        in_use=frozenset({("gpu.nvidia.com", "n1", "gpu-0")})),
    "selector-picks-model": Case(
        a_claim().request(selectors=(H100,)), fleet(*node("a", "A100", 2), *node("b", "H100", 1)),
        State.ALLOCATED, "b", ("gpu-0",)),
    "already-allocated": Case(
        a_claim().request(), fleet(*node("n1", "H100", 1)), State.PENDING,
        reason="Insufficient nvidia.com/gpu: requested 1, free 0 of 1 on 1 node",
        in_use=frozenset({("gpu.nvidia.com", "n1", "gpu-0")})),
    "unknown-class": Case(a_claim().request(cls="nope.example.com"), fleet(*node("n1", "H100", 1)),
                          State.REJECTED, reason="unknown device class 'nope.example.com'"),
    "invalid-cel": Case(a_claim().request(selectors=("device.attributes[",)), fleet(*node("n1", "H100", 1)),
                        State.REJECTED, reason="CEL compile error"),
    "cel-missing-key": Case(
        a_claim().request(selectors=('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',)),
        fleet(*node("n1", "H100", 1)), State.REJECTED, reason="guarding the check with has()"),
    "cel-unknown-domain-is-empty": Case(
        a_claim().request(selectors=('!has(device.attributes["amd.com"].x)',)), fleet(*node("n1", "H100", 1)),
        State.ALLOCATED, "n1"),
    "too-many-devices": Case(a_claim().request(count=33), fleet(*node("n1", "H100", 1)), State.REJECTED,
                             reason="over the claim limit of 32", checked=False),
    "too-many-requests": Case(
        ClaimBuilder(requests=[{"name": f"r{i}", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                               for i in range(33)]),
        fleet(*node("n1", "H100", 1)), State.REJECTED, reason="33 requests, over the limit of 32", checked=False),
    "match-numa": Case(
        a_claim().request(count=2).match("gpu.nvidia.com/numa-node"),
        fleet(gpu("n1", 0, numa=0), gpu("n1", 1, numa=1), gpu("n1", 2, numa=1)),
        State.ALLOCATED, "n1", ("gpu-1", "gpu-2")),
    "match-missing-attribute": Case(
        a_claim().request(count=1).match("gpu.nvidia.com/nvlinkDomain"), fleet(*node("n1", "H100", 2)),
        State.PENDING, reason="constraints cannot be met"),
    "distinct": Case(
        a_claim().request(count=2).distinct("gpu.nvidia.com/numa-node"),
        fleet(gpu("n1", 0, numa=0), gpu("n1", 1, numa=0), gpu("n1", 2, numa=1)),
        State.ALLOCATED, "n1", ("gpu-0", "gpu-2")),
    "all-mode": Case(a_claim().request(mode="All", count=None), fleet(*node("n1", "H100", 3)), State.ALLOCATED,
                     "n1", ("gpu-0", "gpu-1", "gpu-2")),
    "all-mode-some-allocated": Case(
        a_claim().request(mode="All", count=None), fleet(*node("n1", "H100", 2)), State.PENDING,
        in_use=frozenset({("gpu.nvidia.com", "n1", "gpu-0")})),
    "first-available-falls-back": Case(
        a_claim().first_available(
            "gpu",
            {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4},
            {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1}),
        fleet(*node("n1", "H100", 2)), State.ALLOCATED, "n1", ("gpu-0",)),
    "taint-blocks": Case(
        a_claim().request(), fleet(gpu("n1", 0, taints=({"key": "bad", "effect": "NoSchedule"},))),
        State.PENDING),
    "taint-tolerated": Case(
        a_claim().request(tolerations=[{"key": "bad", "operator": "Exists"}]),
        fleet(gpu("n1", 0, taints=({"key": "bad", "effect": "NoSchedule"},))), State.ALLOCATED, "n1"),
    "taint-no-effect-ignored": Case(
        a_claim().request(), fleet(gpu("n1", 0, taints=({"key": "x", "effect": "None"},))), State.ALLOCATED, "n1"),
    "best-fit-smallest-memory": Case(
        a_claim().request(), fleet(*node("big", "H200", 1), *node("small", "A100-40GB", 1)),
        State.ALLOCATED, "small"),
    "admin-access-ignores-allocations": Case(
        a_claim().request(adminAccess=True), fleet(*node("n1", "H100", 1)), State.ALLOCATED, "n1", ("gpu-0",),
        in_use=frozenset({("gpu.nvidia.com", "n1", "gpu-0")})),
    "no-device-can-ever-fit-names-the-closest": Case(
        a_claim().request(selectors=(
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("200Gi")) >= 0',)),
        fleet(*node("a", "A100", 1), *node("b", "B200", 1)), State.PENDING,
        reason="no device in the fleet (2 devices on 2 nodes) matches its selectors; it waits until one appears. "
               "The closest device is b/gpu-0 (B200, 179.1 GiB of memory)."),
    "did-you-mean": Case(
        a_claim().request(selectors=(H100,)), fleet(gpu("n1", 0, "NVIDIA H100 80GB HBM3")), State.PENDING,
        reason="did you mean 'NVIDIA H100 80GB HBM3'"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decide(case: Case) -> None:
    claim = case.claim.build() if case.checked else dra.ResourceClaim.model_validate(case.claim.document())
    decision: Decision = decide(claim, case.fleet, BUILTIN_CLASSES, case.in_use)
    assert decision.state is case.state, decision.reason
    if case.node is not None:
        assert decision.allocation is not None and decision.allocation.node == case.node
    if case.devices is not None:
        assert decision.allocation is not None
        assert tuple(r.device for r in decision.allocation.results) == case.devices
    if case.reason is not None:
        assert decision.reason is not None and case.reason in decision.reason


def test_settle_sees_earlier_allocations_and_prefers_used_nodes() -> None:
    f = fleet(*node("n1", "H100", 2), *node("n2", "H100", 2))
    claims = [a_claim(f"c{i}").request().build() for i in range(5)]
    outcomes = settle(claims, f, BUILTIN_CLASSES, ())
    placed = [(o.decision.allocation.node, o.decision.allocation.results[0].device) for o in outcomes[:4]
              if o.decision.allocation]
    assert placed == [("n1", "gpu-0"), ("n1", "gpu-1"), ("n2", "gpu-0"), ("n2", "gpu-1")]
    assert outcomes[4].decision.state is State.PENDING
    assert outcomes[4].decision.reason == "Insufficient nvidia.com/gpu: requested 1, free 0 of 4 on 2 nodes"


def test_admin_access_results_hold_no_device() -> None:
    f = fleet(*node("n1", "H100", 1))
    monitor = a_claim("monitor").request(adminAccess=True).build()
    worker = a_claim("worker").request().build()
    first, second = settle([monitor, worker], f, BUILTIN_CLASSES, ())
    assert first.decision.allocation is not None and first.decision.allocation.keys == ()
    assert first.decision.allocation.to_json()["devices"]["results"][0]["adminAccess"] is True
    assert second.decision.state is State.ALLOCATED
