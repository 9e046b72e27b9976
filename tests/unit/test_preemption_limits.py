"""Preemption that does not thrash: minRuntime and maxPreemptionsPerMinute hold back reclaim and fair-share
preemption of a tenant's claims (never priority preemption within a tenant), and the waiting claim's
answer says when it may preempt. Table tests on the reclaim case of test_admission, and a property over
random waves with a clock: nothing is preempted sooner than its minRuntime, and preemptions stay bounded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig, QuotaFileError, parse_quotas
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.results import State
from tests.builders import a_claim, fleet, node

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
FLEET = fleet(*node("h", "H100", 4))


def quotas(vision: dict[str, Any] | None = None, nlp: dict[str, Any] | None = None) -> QuotaConfig:
    return parse_quotas({"kind": "Quotas", "tenants": [
        {"name": "vision", "cohort": "r", "quotas": {"H100": {"nominal": 1}}, **(vision or {})},
        {"name": "nlp", "cohort": "r", "quotas": {"H100": {"nominal": 3}}, **(nlp or {})}]})


def waiting(name: str, tenant: str, count: int = 1, priority: int = 0, arrival: int = 10) -> Waiting:
    claim = a_claim(name, tenant).request(count=count).build()
    return Waiting(tenant, name, claim, priority, True, arrival)


def running_vision(config: QuotaConfig, ages: list[float]) -> tuple[Running, ...]:
    """vision's claims, one GPU each, allocated `ages` seconds before NOW (vision borrows beyond 1)."""
    first = run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, config, (),
                               tuple(waiting(f"v{i}", "vision", arrival=i) for i in range(len(ages)))))
    allocated = [d for d in first.decisions if d.decision.allocation is not None]
    return tuple(Running("vision", d.name, d.decision.allocation, 0, True, i, i, NOW - ages[i])
                 for i, d in enumerate(allocated))


@dataclass
class Row:
    vision: dict[str, Any]
    ages: list[float]  # seconds each vision claim has run
    recent: int  # vision's claims preempted for reclaim or fair share in the last minute
    expect: str  # n1's state
    preempted: list[str]
    reason: str | None = None


ROWS = {
    "reclaim-of-claims-past-their-min-runtime": Row({"minRuntime": "5m"}, [900, 800, 700, 600], 0, "Allocated",
                                                    ["v3", "v2"]),
    "young-claims-are-spared-and-the-answer-says-until-when": Row(
        {"minRuntime": "5m"}, [900, 100, 80, 60], 0, "Pending", [],
        "reclaim preemption of vision's claims possible from 08:03:20 UTC, when their minRuntime ends"),
    "only-the-old-ones-when-they-are-enough": Row({"minRuntime": "5m"}, [900, 800, 700, 60], 0, "Allocated",
                                                  ["v2", "v1"]),
    "no-min-runtime-no-wait": Row({}, [10, 10, 10, 10], 0, "Allocated", ["v3", "v2"]),
    "the-rate-spent-in-the-last-minute": Row({"maxPreemptionsPerMinute": 3}, [900] * 4, 3, "Pending", []),
    "the-rate-spent-within-the-cycle": Row({"maxPreemptionsPerMinute": 1}, [900] * 4, 0, "Pending", []),
    "the-rate-with-room-left": Row({"maxPreemptionsPerMinute": 5}, [900] * 4, 3, "Allocated", ["v3", "v2"]),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_reclaim_waits_for_min_runtime_and_the_rate(row: Row) -> None:
    config = quotas(vision=row.vision)
    running = running_vision(config, row.ages)
    result = run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, config, running, (waiting("n1", "nlp", count=2),),
                                now=NOW, recent_preemptions={"vision": row.recent}))
    decided = {d.name: d.decision for d in result.decisions}
    assert decided["n1"].state.value == row.expect, decided["n1"].reason
    assert [p.victim[1] for p in result.preemptions] == row.preempted
    assert all(p.rule == "reclaim" for p in result.preemptions)
    if row.reason is not None:
        assert row.reason in (decided["n1"].reason or "")


def test_the_brokers_default_min_runtime_applies_to_tenants_without_their_own() -> None:
    config = quotas()
    held = QuotaConfig(config.flavors, config.cohorts, config.tenants, config.listed_flavors, default_min_runtime=300)
    running = running_vision(held, [60, 60, 60, 60])
    result = run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, held, running, (waiting("n1", "nlp", count=2),), now=NOW))
    assert result.preemptions == () or list(result.preemptions) == []
    assert run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, held, running, (waiting("n1", "nlp", count=2),))
                     ).preemptions, "without a clock (simulate) every claim has run long enough"


def test_priority_preemption_within_a_tenant_is_not_held_back() -> None:
    config = quotas(vision={"minRuntime": "1h", "maxPreemptionsPerMinute": 0})
    low = run_cycle(Snapshot(fleet(*node("h", "H100", 1)), BUILTIN_CLASSES, QuotaConfig(), (),
                             (waiting("low", "vision", arrival=0),)))
    allocation = low.decisions[0].decision.allocation
    assert allocation is not None
    running = (Running("vision", "low", allocation, 0, True, 0, 0, NOW - 1),)
    result = run_cycle(Snapshot(fleet(*node("h", "H100", 1)), BUILTIN_CLASSES, config, running,
                                (waiting("urgent", "vision", priority=9),), now=NOW))
    assert [(p.victim[1], p.rule) for p in result.preemptions] == [("low", "priority")]
    assert result.decisions[0].decision.state is State.ALLOCATED


@pytest.mark.parametrize(("field", "value", "error"), [
    ("minRuntime", "soon", "minRuntime: invalid duration"),
    ("maxPreemptionsPerMinute", -1, "maxPreemptionsPerMinute: expected a whole number"),
    ("maxPreemptionsPerMinute", True, "maxPreemptionsPerMinute: expected a whole number"),
])
def test_a_wrong_limit_in_the_quotas_file_names_its_field(field: str, value: Any, error: str) -> None:
    with pytest.raises(QuotaFileError, match=error):
        parse_quotas({"kind": "Quotas", "tenants": [{"name": "t", field: value}]})


def test_the_limits_round_trip_through_the_quotas_file() -> None:
    config = parse_quotas({"kind": "Quotas", "tenants": [
        {"name": "t", "minRuntime": "5m", "maxPreemptionsPerMinute": 4}]})
    tenant = config.tenants["t"]
    assert (tenant.min_runtime, tenant.max_preemptions_per_minute) == (300.0, 4)
    again = parse_quotas({"kind": "Quotas", "tenants": [tenant.to_json()]}).tenants["t"]
    assert (again.min_runtime, again.max_preemptions_per_minute) == (300.0, 4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["vision", "nlp", "speech"]), st.integers(1, 4), st.integers(0, 3)),
                min_size=4, max_size=30),
       st.integers(30, 600), st.integers(1, 60))
def test_nothing_is_preempted_within_its_min_runtime_and_preemption_stays_bounded(
        arrivals: list[tuple[str, int, int]], min_runtime: int, step: int) -> None:
    """Claims arrive a few a cycle, cycles are `step` seconds apart, every claim runs until preempted:
    no claim is preempted for reclaim or fair share sooner than minRuntime after its allocation, so none
    more often than once per minRuntime of the run."""
    config = parse_quotas({"kind": "Quotas", "cohorts": [{"name": "r"}], "tenants": [
        {"name": t, "cohort": "r", "minRuntime": f"{min_runtime}s", "quotas": {"H100": {"nominal": n}}}
        for t, n in (("vision", 2), ("nlp", 3), ("speech", 3))]})
    kept, now = KeptState(), NOW
    running: dict[tuple[str, str], Running] = {}
    queue: dict[tuple[str, str], Waiting] = {}
    admitted: dict[tuple[str, str], int] = {}
    preempted: dict[tuple[str, str], int] = {}
    for serial, (tenant, count, _) in enumerate(arrivals):
        queue[(tenant, f"c{serial}")] = waiting(f"c{serial}", tenant, count=min(count, 2), arrival=serial)
        if serial % 3:
            continue  # three arrivals a cycle
        now += step
        result = run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, config, tuple(running.values()), tuple(queue.values()),
                                    now=now), kept)
        for p in result.preemptions:
            victim = running.pop(p.victim)
            if p.rule != "priority":
                assert victim.allocated_at is not None and now - victim.allocated_at >= min_runtime, p
            preempted[p.victim] = preempted.get(p.victim, 0) + 1
            queue[p.victim] = waiting(p.victim[1], p.victim[0], arrival=victim.arrival)
        for d in result.decisions:
            key = (d.tenant, d.name)
            if d.decision.allocation is not None and key in queue:
                was = queue.pop(key)
                running[key] = Running(d.tenant, d.name, d.decision.allocation, was.priority, True, was.arrival,
                                       len(admitted) + 1, now)
                admitted[key] = admitted.get(key, 0) + 1
    # so no claim is preempted more often than once per minRuntime of the run (and once more at its end)
    span = now - NOW
    assert all(times <= span // min_runtime + 1 for times in preempted.values()), (preempted, span)
