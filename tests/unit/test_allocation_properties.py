"""Invariants of the allocator over random fleets and claim waves (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.dra.allocation import settle
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.results import State
from tests.builders import a_claim, fleet, gpu

MODELS = ("A100", "H100", "H200")


@st.composite
def fleets(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    devices = []
    for n in range(draw(st.integers(1, 4))):
        model = draw(st.sampled_from(MODELS))
        for i in range(draw(st.integers(1, 6))):
            devices.append(gpu(f"n{n}", i, model, numa=draw(st.integers(0, 1))))
    return fleet(*devices)


claim_specs = st.lists(
    st.tuples(st.integers(1, 3), st.none() | st.sampled_from(MODELS), st.booleans()), min_size=1, max_size=12
)


@settings(max_examples=150, deadline=None)
@given(fleets(), claim_specs)
def test_no_device_twice_and_every_device_satisfies_its_claim(f, specs) -> None:  # type: ignore[no-untyped-def]
    claims = []
    for index, (count, model, same_numa) in enumerate(specs):
        builder = a_claim(f"c{index}").request(
            count=count,
            selectors=(f'device.attributes["gpu.nvidia.com"].productName == "{model}"',) if model else ())
        if same_numa:
            builder.match("gpu.nvidia.com/numa-node")
        claims.append((builder.build(), count, model, same_numa))
    outcomes = settle([c for c, *_ in claims], f, BUILTIN_CLASSES, ())
    by_key = {d.key: d for d in f.devices}
    taken: set[tuple[str, str, str]] = set()
    for outcome, (_, count, model, same_numa) in zip(outcomes, claims, strict=True):
        assert outcome.decision.state in (State.ALLOCATED, State.PENDING)
        allocation = outcome.decision.allocation
        if allocation is None:
            assert outcome.decision.reason
            continue
        keys = allocation.keys
        assert len(keys) == count
        assert not taken & set(keys), "a device was allocated twice"
        taken |= set(keys)
        devices = [by_key[k] for k in keys]
        assert {d.node for d in devices} == {allocation.node}
        if model:
            assert {d.attribute_text("gpu.nvidia.com/productName") for d in devices} == {model}
        if same_numa:
            assert len({d.attributes["gpu.nvidia.com/numa-node"] for d in devices}) == 1


@settings(max_examples=100, deadline=None)
@given(fleets(), claim_specs)
def test_a_pending_claim_really_does_not_fit(f, specs) -> None:  # type: ignore[no-untyped-def]
    """A claim left Pending could not be placed on the devices the earlier claims left free."""
    claims = [a_claim(f"c{i}").request(count=count).build() for i, (count, _, _) in enumerate(specs)]
    outcomes = settle(claims, f, BUILTIN_CLASSES, ())
    taken: set[tuple[str, str, str]] = set()
    for outcome, (count, _, _) in zip(outcomes, specs, strict=True):
        if outcome.decision.allocation is not None:
            taken |= set(outcome.decision.allocation.keys)
            continue
        free_per_node: dict[str, int] = {}
        for d in f.devices:
            if d.key not in taken:
                free_per_node[d.node] = free_per_node.get(d.node, 0) + 1
        assert max(free_per_node.values(), default=0) < count
