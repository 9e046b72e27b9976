"""The placement budget (shared/dra/budget.py, sweep.py): what a claim's placement may cost in one cycle,
what its tenant's claims share, that work cut short goes on where it stopped, and that the claims that pay
for it are the only ones that wait. Table-driven with builders; hypothesis for "cut and resumed, a search
finds what one uninterrupted search finds"."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.admission.simulate import run_waves
from shared.dra import budget
from shared.dra.allocation import FleetState
from shared.dra.budget import BudgetExceeded, Meter, Unmetered
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.results import Decision, State
from tests.builders import ClaimBuilder, a_claim, fleet, node

ATTR = 'device.attributes["gpu.nvidia.com"]'


def waiting(builder: ClaimBuilder, arrival: int = 0) -> Waiting:
    claim = builder.build()
    return Waiting(claim.metadata.namespace or "default", claim.metadata.name, claim, 0, True, arrival)


def bomb(name: str, namespace: str = "evil", requests: int = 8, alternatives: int = 4) -> ClaimBuilder:
    """Requests of firstAvailable subrequests whose selectors all differ in text and all accept every GPU,
    under a matchAttribute on the GPU's uuid: no node can hold two such devices."""
    builder = a_claim(name, namespace)
    for r in range(requests):
        subrequests = [{"name": f"s{s}", "deviceClassName": "gpu.nvidia.com", "count": 1,
                        "selectors": [{"cel": {"expression": f'{ATTR}.productName != "{name}-{r}-{s}"'}}]}
                       for s in range(alternatives)]
        builder.first_available(f"r{r}", *subrequests)
    return builder.match("gpu.nvidia.com/uuid")


def a_fleet(nodes: int = 4, per_node: int = 4, model: str = "H100") -> Any:
    return fleet(*(d for n in range(nodes) for d in node(f"n{n}", model, per_node)))


# -- the meter --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "progress", "spends", "spent", "refused"), [
    (10, True, [3, 3, 3], 9, False),
    (10, True, [3, 3, 5], 6, True),  # refused work is not counted: it was not done
    (10, True, [10], 10, False),
    (10, False, [30, 30], 60, False),  # a first piece runs past the limit: every meter makes progress
    (10, False, [budget.PIECE_LIMIT, 1], budget.PIECE_LIMIT, True),  # but not past PIECE_LIMIT
    (0, False, [1], 0, True),  # a meter given nothing does nothing
])
def test_a_meter_refuses_work_that_would_run_past_its_limit(limit: int, progress: bool, spends: list[int], spent: int,
                                                           refused: bool) -> None:
    meter = Meter(limit)
    if progress:
        meter.progressed()
    stopped = False
    for units in spends:
        try:
            meter.spend(units)
        except BudgetExceeded:
            stopped = True
            break
    assert (meter.spent, stopped) == (spent, refused)


@pytest.mark.parametrize(("limit", "progress", "whole", "done"), [
    (10, False, 50, True),  # a first piece is done whole, past the limit: a piece bigger than any budget
    (10, True, 50, False),  # after other work it waits for the next meter
    (10, True, 8, True),
    (0, False, 5, False),
])
def test_indivisible_work_is_done_whole_once_per_meter(limit: int, progress: bool, whole: int, done: bool) -> None:
    meter = Meter(limit)
    if progress:
        meter.progressed()
    try:
        meter.spend_whole(whole)
    except BudgetExceeded:
        assert not done
    else:
        assert done and meter.spent == whole and meter.done


def test_unmetered_work_is_counted_and_never_stopped() -> None:
    meter = Unmetered()
    meter.spend(10**9)
    meter.spend_whole(10**9)
    assert meter.spent == 2 * 10**9


# -- one claim's search, cut and resumed -----------------------------------------------------------------


def decide_until_done(state: FleetState, claim: Any, limit: int, rounds: int = 10_000) -> tuple[Decision, int]:
    for attempt in range(1, rounds + 1):
        decision = state.decide(claim, meter=Meter(limit))
        if not decision.cut:
            return decision, attempt
    raise AssertionError(f"still cut after {rounds} attempts")


def test_a_search_cut_short_says_so_and_goes_on_where_it_stopped() -> None:
    f = a_fleet(nodes=6, per_node=4)
    claim = bomb("b", requests=4, alternatives=3).build()
    state = FleetState(f, BUILTIN_CLASSES, ())
    state.capacity_version(state.plan(claim))  # compiled and indexed (unmetered): what is cut is the search
    first = state.decide(claim, meter=Meter(200))
    assert first.state is State.PENDING and first.cut
    assert "placement search exceeded its budget (a claim of 4 requests in 81 firstAvailable combinations)" in (
        first.reason or "")
    final, attempts = decide_until_done(state, claim, 200)
    assert attempts > 1 and final.state is State.PENDING and not final.cut
    again = state.decide(claim, meter=Meter(200))  # nothing freed since: nothing searched again
    assert again.state is State.PENDING and not again.cut


def test_a_search_done_looks_again_only_where_devices_were_freed() -> None:
    f = a_fleet(nodes=20, per_node=4)
    wide = a_claim("wide").request("a").request("b").distinct("gpu.nvidia.com/uuid").build()
    state = FleetState(f, BUILTIN_CLASSES, ())
    held = {}
    for n in range(20):  # every node keeps one GPU free: no node has room for two
        decision = state.decide(a_claim(f"h{n}").request(count=3).build(), meter=Meter(budget.ONE_SHOT_BUDGET))
        assert decision.allocation is not None
        state.take(decision.allocation)
        held[decision.allocation.node] = decision.allocation
    swept = Meter(budget.ONE_SHOT_BUDGET)
    assert state.decide(wide, meter=swept).state is State.PENDING
    unchanged = Meter(budget.ONE_SHOT_BUDGET)
    assert state.decide(wide, meter=unchanged).state is State.PENDING
    state.give_back(held["n7"])
    after = Meter(budget.ONE_SHOT_BUDGET)
    decision = state.decide(wide, meter=after)
    assert decision.allocation is not None and decision.allocation.node == "n7"
    assert unchanged.spent < swept.spent / 5 and after.spent < swept.spent / 5


def test_subrequests_that_accept_alike_are_searched_once() -> None:
    f = a_fleet(nodes=8, per_node=4)
    alike = bomb("alike", requests=6, alternatives=4).build()  # 4,096 combinations, all alike (256 tried)
    plain = a_claim("plain", "evil")
    for r in range(6):
        plain.request(f"r{r}")
    one = plain.match("gpu.nvidia.com/uuid").build()
    costs = []
    for claim in (one, alike):
        state = FleetState(f, BUILTIN_CLASSES, ())
        state.decide(claim, meter=Meter(budget.ONE_SHOT_BUDGET))  # the selectors compiled and evaluated
        state.forget(state.plan(claim))  # what the search found is forgotten, the indexes stay
        meter = Meter(budget.ONE_SHOT_BUDGET)
        assert state.decide(claim, meter=meter).state is State.PENDING
        costs.append(meter.spent)
    assert costs[1] < 3 * costs[0] + 256 * (6 + 1)  # a step per combination and request looked at, one search


def test_requests_that_accept_alike_share_one_index_and_it_goes_with_their_claims() -> None:
    f = a_fleet(nodes=3, per_node=2)
    state = FleetState(f, BUILTIN_CLASSES, ())
    first = state.plan(a_claim("x").request(selectors=(f'{ATTR}.productName == "H100"',)).build())
    second = state.plan(a_claim("y").request(selectors=(f'{ATTR}.productName != "A100"',)).build())
    state.capacity_version(first)
    state.capacity_version(second)
    a, b = first.requests[0][1][0], second.requests[0][1][0]
    assert state.index(a) is state.index(b)
    kept = state.index(a)
    state.forget(first)
    assert state.index(b) is kept  # still read by the second claim's plan
    state.forget(second)
    assert state.index(b) is not kept  # built again: nothing kept it


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(2, 6), per_node=st.integers(1, 4), requests=st.integers(1, 3), alternatives=st.integers(1, 3),
       free=st.lists(st.integers(0, 3), min_size=6, max_size=6), limit=st.integers(1, 40),
       distinct=st.booleans())
def test_cut_and_resumed_a_search_finds_what_one_search_finds(nodes: int, per_node: int, requests: int,
                                                              alternatives: int, free: list[int], limit: int,
                                                              distinct: bool) -> None:
    f = a_fleet(nodes, per_node)
    builder = a_claim("c")
    for r in range(requests):
        builder.first_available(f"r{r}", *({"name": f"s{s}", "deviceClassName": "gpu.nvidia.com", "count": s + 1}
                                           for s in range(alternatives)))
    claim = (builder.distinct("gpu.nvidia.com/uuid") if distinct else builder.match("gpu.nvidia.com/numa-node")).build()
    in_use = [d.key for n in range(nodes) for d in f.nodes[f"n{n}"].devices[free[n] % (per_node + 1):]]
    whole = FleetState(f, BUILTIN_CLASSES, in_use).decide(claim, meter=Meter(budget.ONE_SHOT_BUDGET))
    sliced, _ = decide_until_done(FleetState(f, BUILTIN_CLASSES, in_use), claim, limit)
    assert sliced.state is whole.state
    if whole.allocation is not None and sliced.allocation is not None:
        # the same firstAvailable choice, on a node as good (nodes that score alike may come in another order)
        assert [r.request for r in sliced.allocation.results] == [r.request for r in whole.allocation.results]
        picked = [f.by_key[k] for k in sliced.allocation.keys]
        assert all(d.node == sliced.allocation.node and d.key not in in_use for d in picked)
        assert len(set(sliced.allocation.keys)) == len(picked)
        free_there = {n: sum(1 for d in f.nodes[n].devices if d.key not in in_use) for n in f.nodes}
        assert free_there[sliced.allocation.node] == free_there[whole.allocation.node]


# -- a cycle: tenants share budgets, and the calm one is not slowed -----------------------------------------


def cycle_until(fleet_: Any, waiting_: list[Waiting], cycles: int, budget_: int = budget.TENANT_BUDGET
                ) -> list[dict[tuple[str, str], Decision]]:
    kept, queue = KeptState(), {w.key: w for w in waiting_}
    out = []
    for _ in range(cycles):
        result = run_cycle(Snapshot(fleet_, BUILTIN_CLASSES, QuotaConfig(), (), tuple(queue.values()),
                                    tenant_budget=budget_), kept)
        decided = {(d.tenant, d.name): d.decision for d in result.decisions}
        out.append(decided)
        for key in decided:
            if key in queue and not queue[key].answered:
                queue[key] = replace(queue[key], answered=True)
    return out


@pytest.mark.parametrize("bombs", [1, 8, 32])
def test_a_tenants_expensive_claims_wait_their_turn_and_cost_another_tenant_nothing(bombs: int) -> None:
    f = a_fleet(nodes=6, per_node=4)
    claims = [waiting(bomb(f"b{i}"), arrival=i) for i in range(bombs)]
    calm = waiting(a_claim("calm", "calm").request(), arrival=1_000)
    cycles = cycle_until(f, [*claims, calm], budget.CUT_PATIENCE)
    assert cycles[0][("calm", "calm")].state is State.ALLOCATED  # in the first cycle, whatever waits beside
    early = [cycle[c.key] for cycle in cycles[:-1] for c in claims if c.key in cycle]
    assert not any(d.cut for d in early)  # no word of a budget while the work goes on: a verdict, or nothing
    last: dict[tuple[str, str], Decision] = {}
    for cycle in cycles:
        last.update(cycle)
    assert all(c.key in last for c in claims)  # within CUT_PATIENCE cycles each has its answer
    if bombs > 1:
        assert any(last[c.key].cut for c in claims)  # those still searched say why they wait


def test_an_ordinary_claim_with_new_selectors_never_says_its_search_was_cut() -> None:
    f = a_fleet(nodes=6, per_node=4)
    claims = [waiting(a_claim(f"c{i}").request(selectors=(f'{ATTR}.productName != "other-{i}"',)), arrival=i)
              for i in range(12)]  # twelve new selectors: more than a tenant's budget compiles in one cycle
    cycles = cycle_until(f, claims, budget.CUT_PATIENCE)
    answers = [d for cycle in cycles for d in cycle.values()]
    assert answers and not any(d.cut for d in answers)
    assert {key for cycle in cycles for key, d in cycle.items() if d.state is State.ALLOCATED} == {
        c.key for c in claims}


def test_expensive_claims_are_answered_in_full_over_the_next_cycles() -> None:
    f = a_fleet(nodes=4, per_node=4)
    claims = [waiting(bomb(f"b{i}", requests=3, alternatives=3), arrival=i) for i in range(3)]
    answers: dict[tuple[str, str], Decision] = {}
    for decided in cycle_until(f, claims, 400):
        answers.update(decided)
    assert {answers[c.key].state for c in claims} == {State.PENDING}
    assert not any(answers[c.key].cut for c in claims), [answers[c.key].reason for c in claims]


def test_a_cycle_of_a_tenant_with_many_expensive_claims_spends_its_budget_and_a_floor() -> None:
    f = a_fleet(nodes=6, per_node=4)
    kept = KeptState()
    claims = tuple(waiting(bomb(f"b{i}"), arrival=i) for i in range(20))
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), claims, tenant_budget=500), kept)
    state = kept.admission
    assert state is not None and result.deferred >= 20
    left = state.budget.allowance["evil"]
    assert left <= 0 < 500 + 500 // 4 + left + 1_000  # a bounded debt


def test_simulate_goes_on_until_the_cut_work_is_done() -> None:
    f = a_fleet(nodes=4, per_node=4)
    result = run_waves(f, BUILTIN_CLASSES, [[bomb("b", requests=4, alternatives=3).build(),
                                             a_claim("calm", "calm").request(count=2).build()]])
    states = {(o.namespace, o.name): o.decision for o in result.outcomes}
    assert states[("calm", "calm")].state is State.ALLOCATED
    assert states[("evil", "b")].state is State.PENDING and not states[("evil", "b")].cut


def test_a_claims_reason_names_a_few_of_its_requests_not_all() -> None:
    f = a_fleet(nodes=2, per_node=2)
    state = FleetState(f, BUILTIN_CLASSES, [d.key for d in f.devices])
    decision = state.decide(bomb("b", requests=8, alternatives=4).build(), meter=Meter(budget.ONE_SHOT_BUDGET))
    assert decision.state is State.PENDING and decision.reason is not None
    assert "and 28 more requests and alternatives alike (see explain)" in decision.reason
    assert len(decision.reason) < 2_000


def test_running_claims_pay_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Holding what runs needs no placement: a cycle with only running claims spends no tenant's budget."""
    f = a_fleet(nodes=2, per_node=4)
    state = FleetState(f, BUILTIN_CLASSES, ())
    decision = state.decide(a_claim("r").request(count=2).build(), meter=Meter(budget.ONE_SHOT_BUDGET))
    assert decision.allocation is not None
    kept = KeptState()
    run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (Running("t", "r", decision.allocation),), ()), kept)
    assert kept.admission is not None and kept.admission.budget.allowance == {}


# -- memory: what a waiting claim holds ----------------------------------------------------------------------


def test_selectors_that_differ_only_in_a_value_share_their_signatures_and_a_map_key_still_counts() -> None:
    from shared.dra.cel import selector_text
    from shared.dra.matching import SelectorMemo

    devices = [d for n in ("a", "b") for d in node(n, "H100" if n == "a" else "A100", 2)]
    memo = SelectorMemo()
    for i in range(200):
        for device in devices:
            memo.matches(selector_text(f'{ATTR}.productName != "x-{i}"'), device)
    assert len(memo.signatures) <= 4, len(memo.signatures)  # per kind of device, not per selector
    keyed = selector_text('device.attributes["gpu.nvidia.com"]["productName"] == "H100"')
    assert [memo.matches(keyed, d) for d in devices] == [True, True, False, False]


def test_a_parsed_claims_objects_share_their_field_sets() -> None:
    claim = bomb("b", requests=4, alternatives=4).build()
    subrequests = [s for r in claim.spec.devices.requests for s in r.first_available or ()]
    assert len({id(s.__pydantic_fields_set__) for s in subrequests}) == 1
