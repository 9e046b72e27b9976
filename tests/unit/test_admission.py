"""Quotas, fair share and preemption in the pure cycle, table-driven; hypothesis for the invariants."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.admission.cycle import run_cycle
from shared.admission.flavors import Flavors
from shared.admission.kept import KeptState
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig, TenantQuota, parse_quotas, pending_limit_problem
from shared.admission.quota_book import QuotaBook
from shared.admission.simulate import run_waves
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo
from shared.dra.results import Allocation, DeviceResult, State
from tests.builders import ClaimBuilder, a_claim, fleet, node
from tests.waves import Waves

H100 = 'device.attributes["gpu.nvidia.com"].productName == "H100"'
B200 = 'device.attributes["gpu.nvidia.com"].productName == "B200"'


def quotas(*tenants: dict[str, Any]) -> QuotaConfig:
    return parse_quotas({"kind": "Quotas", "tenants": list(tenants)})


def waiting(builder: ClaimBuilder, priority: int = 0, arrival: int = 0) -> Waiting:
    claim = builder.build()
    return Waiting(claim.metadata.namespace or "default", claim.metadata.name, claim, priority, True, arrival)


@dataclass
class Case:
    fleet: Fleet
    quotas: QuotaConfig
    first: list[Waiting]  # admitted in a first cycle
    then: list[Waiting]  # the cycle under test
    expect: dict[str, str]  # claim name -> state after the second cycle
    preempted: list[tuple[str, str]] = field(default_factory=list)  # (victim, rule)
    reason: str | None = None  # a substring of the first pending reason
    node: str | None = None  # where the claims allocated in the cycle under test go


LAB = fleet(*node("h100", "H100", 4), *node("b200", "B200", 4))
CASES = {
    "open-fleet-fair-order": Case(
        fleet(*node("n", "H100", 2)), QuotaConfig(),
        [waiting(a_claim("a1", "a").request())],
        [waiting(a_claim("a2", "a").request(), arrival=1), waiting(a_claim("b1", "b").request(), arrival=2),
         waiting(a_claim("a3", "a").request(), arrival=3)],
        {"a2": "Pending", "b1": "Allocated", "a3": "Pending"}),
    "admin-access-of-an-unmarked-tenant": Case(
        LAB, quotas({"name": "vision", "quotas": {"H100": {"nominal": 4}}}), [],
        [waiting(a_claim("monitor", "vision").request(adminAccess=True))], {"monitor": "Rejected"}),
    "admin-access-of-an-unmarked-tenant-without-quota": Case(
        LAB, quotas({"name": "vision"}), [],
        [waiting(a_claim("monitor", "vision").request(adminAccess=True))], {"monitor": "Rejected"}),
    "admin-access-of-a-marked-tenant": Case(
        LAB, quotas({"name": "vision", "adminAccess": True, "quotas": {"H100": {"nominal": 4}}}),
        [waiting(a_claim("w", "vision").request(count=4, selectors=(H100,)))],
        [waiting(a_claim("monitor", "vision").request(adminAccess=True, selectors=(H100,)), arrival=1)],
        {"monitor": "Allocated"}, node="h100"),
    "admin-access-on-an-open-fleet": Case(
        LAB, QuotaConfig(), [], [waiting(a_claim("monitor", "vision").request(adminAccess=True))],
        {"monitor": "Rejected"}),
    "h100-quota-cannot-take-b200": Case(
        LAB, quotas({"name": "vision", "quotas": {"H100": {"nominal": 4}}},
                    {"name": "nlp", "cohort": "other", "quotas": {"B200": {"nominal": 4}}}),
        [], [waiting(a_claim("b", "vision").request(selectors=(B200,)))], {"b": "Pending"},
        reason="vision needs to borrow 1 more B200"),
    "mig-quota-is-separate-from-whole-gpus": Case(
        fleet(*node("h", "H100", 2)),
        quotas({"name": "vision", "quotas": {"H100-1g.10gb": {"nominal": 7}}},
               {"name": "nlp", "quotas": {"H100": {"nominal": 2}}}),
        [], [waiting(a_claim("whole", "vision").request())], {"whole": "Pending"},
        reason="H100"),
    "borrowing-stops-at-the-lending-limit": Case(
        fleet(*node("h", "H100", 4)),
        quotas({"name": "vision", "cohort": "r", "quotas": {"H100": {"nominal": 0}}},
               {"name": "nlp", "cohort": "r", "quotas": {"H100": {"nominal": 4, "lendingLimit": 1}}}),
        [], [waiting(a_claim("one", "vision").request(), arrival=1),
             waiting(a_claim("two", "vision").request(), arrival=2)],
        {"one": "Allocated", "two": "Pending"}, reason="lend only 0 more"),
    "borrowing-limit": Case(
        fleet(*node("h", "H100", 4)),
        quotas({"name": "vision", "cohort": "r", "quotas": {"H100": {"nominal": 1, "borrowingLimit": 1}}},
               {"name": "nlp", "cohort": "r", "quotas": {"H100": {"nominal": 3}}}),
        [], [waiting(a_claim("three", "vision").request(count=3))], {"three": "Pending"},
        reason="over its borrowingLimit of 1"),
    "reclaim-evicts-exactly-what-is-needed": Case(
        fleet(*node("h", "H100", 4)),
        quotas({"name": "vision", "cohort": "r", "quotas": {"H100": {"nominal": 1}}},
               {"name": "nlp", "cohort": "r", "quotas": {"H100": {"nominal": 3}}}),
        [waiting(a_claim(f"v{i}", "vision").request(), arrival=i) for i in range(4)],
        [waiting(a_claim("n1", "nlp").request(count=2), arrival=10)],
        {"n1": "Allocated"}, preempted=[("v3", "reclaim"), ("v2", "reclaim")]),
    "priority-within-a-tenant-takes-the-lowest": Case(
        fleet(*node("h", "H100", 2)), QuotaConfig(),
        [waiting(a_claim("low", "t").request(), priority=1), waiting(a_claim("lower", "t").request(), priority=0)],
        [waiting(a_claim("urgent", "t").request(), priority=5, arrival=9)],
        {"urgent": "Allocated"}, preempted=[("lower", "priority")]),
    "placement-within-nominal-first": Case(
        fleet(*node("a100", "A100", 1), *node("h100", "H100", 1)),
        quotas({"name": "t", "quotas": {"A100": {"nominal": 1}}}),
        [], [waiting(a_claim("any", "t").request())], {"any": "Allocated"},
        node="a100"),  # within nominal (A100) before the best fit it would borrow (H100)
    "borrowing-takes-the-best-fit": Case(  # no nominal room anywhere: the best fit, as in an open fleet,
        fleet(*node("a100", "A100", 1), *node("h100", "H100", 1)),  # not the first borrowable flavor by name
        quotas({"name": "t", "cohort": "r", "quotas": {"A100": {"nominal": 0}, "H100": {"nominal": 0}}},
               {"name": "l", "cohort": "r", "quotas": {"A100": {"nominal": 1}, "H100": {"nominal": 1}}}),
        [], [waiting(a_claim("any", "t").request())], {"any": "Allocated"}, node="h100"),
    "reclaim-when-its-room-is-lent-out-and-other-flavors-idle": Case(  # H100 room, none idle; a B200 idle,
        fleet(*node("h100", "H100", 1), *node("b200", "B200", 1)),  # no room for it: reclaim the H100
        quotas({"name": "t", "cohort": "r", "quotas": {"H100": {"nominal": 1},
                                                      "B200": {"nominal": 0, "borrowingLimit": 0}}},
               {"name": "u", "cohort": "r", "quotas": {"H100": {"nominal": 0}}}),
        [waiting(a_claim("u1", "u").request(selectors=(H100,)))],
        [waiting(a_claim("any", "t").request(), arrival=1)],
        {"any": "Allocated"}, preempted=[("u1", "reclaim")], node="h100"),
    "devices-no-flavor-counts-need-no-quota": Case(  # an L4 is no flavor's: a tenant at its quota takes it
        fleet(*node("h100", "H100", 2), *node("l4", "L4", 1)),  # (the idle H100 is u's nominal)
        quotas({"name": "t", "quotas": {"H100": {"nominal": 1}}},
               {"name": "u", "cohort": "other", "quotas": {"H100": {"nominal": 1}}}),
        [waiting(a_claim("t1", "t").request(selectors=(H100,)))],
        [waiting(a_claim("h100", "t").request(selectors=(H100,)), arrival=1),
         waiting(a_claim("any", "t").request(), arrival=2)],
        {"h100": "Pending", "any": "Allocated"}, node="l4"),
    "a-tenant-out-of-room-waits-on-quota-with-every-spec": Case(  # idle H100s, all of them u's nominal
        fleet(*node("h", "H100", 4)),
        quotas({"name": "t", "cohort": "c", "quotas": {"H100": {"nominal": 1}}},
               {"name": "u", "cohort": "other", "quotas": {"H100": {"nominal": 3}}}),
        [waiting(a_claim("t1", "t").request())],
        [waiting(a_claim("one", "t").request(), arrival=1), waiting(a_claim("two", "t").request(count=2), arrival=2),
         waiting(a_claim("h100", "t").request(selectors=(H100,)), arrival=3),
         waiting(a_claim("u1", "u").request(count=2), arrival=4)],
        {"one": "Pending", "two": "Pending", "h100": "Pending", "u1": "Allocated"},
        reason="Quota: t needs to borrow 1 more H100"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_cycle(case: Case) -> None:
    memo = KeptState()
    first = run_cycle(Snapshot(case.fleet, BUILTIN_CLASSES, case.quotas, (), tuple(case.first)), memo)
    by_name = {w.name: w for w in case.first}
    running = tuple(Running(d.tenant, d.name, d.decision.allocation, by_name[d.name].priority, True,
                            by_name[d.name].arrival, i)
                    for i, d in enumerate(first.decisions) if d.decision.allocation is not None)
    result = run_cycle(Snapshot(case.fleet, BUILTIN_CLASSES, case.quotas, running, tuple(case.then)), memo)
    states = {d.name: d.decision.state.value for d in result.decisions}
    assert states == case.expect, [d.decision.reason for d in result.decisions]
    assert [(p.victim[1], p.rule) for p in result.preemptions] == case.preempted
    if case.reason is not None:
        reasons = [d.decision.reason or "" for d in result.decisions if d.decision.state is State.PENDING]
        assert any(case.reason in r for r in reasons), reasons
    if case.node is not None:
        assert {d.decision.allocation.node for d in result.decisions if d.decision.allocation} == {case.node}


def test_an_admin_access_refusal_names_the_rule_and_the_tenant() -> None:
    case = CASES["admin-access-of-an-unmarked-tenant"]
    [decided] = run_cycle(Snapshot(case.fleet, BUILTIN_CLASSES, case.quotas, (), tuple(case.then))).decisions
    assert decided.decision.reason is not None
    assert "tenants marked adminAccess: true" in decided.decision.reason
    assert decided.decision.reason.endswith("tenant vision is not")


def test_the_quotas_file_keeps_admin_access_and_max_pending() -> None:
    config = quotas({"name": "vision", "adminAccess": True, "maxPending": 100}, {"name": "nlp"})
    assert config.tenant("vision").admin_access and not config.tenant("nlp").admin_access
    assert (config.tenant("vision").max_pending, config.tenant("nlp").max_pending) == (100, None)
    assert parse_quotas(config.to_document()) == config
    with pytest.raises(ValueError, match=r"tenants\[0\]\.adminAccess: expected true or false"):
        quotas({"name": "vision", "adminAccess": "yes"})
    for wrong in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match=r"tenants\[0\]\.maxPending: expected a whole number"):
            quotas({"name": "vision", "maxPending": wrong})


@pytest.mark.parametrize(("limit", "waiting", "refused"), [(None, 10**6, False), (0, 0, True), (3, 2, False),
                                                          (3, 3, True)])
def test_max_pending_refuses_the_claim_past_it(limit: int | None, waiting: int, refused: bool) -> None:
    problem = pending_limit_problem(TenantQuota("vision", max_pending=limit), waiting)
    assert (problem is not None) == refused
    if problem is not None:
        assert f"has {waiting:,} claims waiting, its maxPending of {limit:,}" in problem


def test_pending_claims_are_explained_with_quota_numbers_and_a_fix() -> None:
    case = CASES["borrowing-limit"]
    result = run_cycle(Snapshot(case.fleet, BUILTIN_CLASSES, case.quotas, (), tuple(case.then)))
    explain = result.decisions[0].explain
    assert explain is not None
    [block] = explain["quota"]
    assert (block["flavor"], block["nominal"], block["borrowingLimit"]) == ("H100", 1, 1)
    assert explain["capacity"][0]["free"] == 4
    assert explain["toAdmit"] == ["raise vision's H100 borrowingLimit from 1 to 2, or its nominal from 1 to 3"]


def test_non_preemptible_claims_are_never_preempted() -> None:
    f = fleet(*node("h", "H100", 1))
    held = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), (waiting(a_claim("keep", "t").request()),)))
    allocation = held.decisions[0].decision.allocation
    assert allocation is not None
    running = (Running("t", "keep", allocation, 0, False, 0, 1),)
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), running,
                                (waiting(a_claim("urgent", "t").request(), priority=9),)))
    assert result.preemptions == () and result.decisions[0].decision.state is State.PENDING


def test_a_running_claim_that_stops_being_preemptible_is_no_victim_in_a_kept_state() -> None:
    """The cycle state kept across snapshots follows a running claim whose annotation changes while it
    holds the same devices: marked not preemptible it is no victim (the other claim is taken instead);
    marked preemptible again, it is the first victim again (its node comes first)."""
    f = fleet(*node("h1", "H100", 1), *node("h2", "H100", 1))
    memo = KeptState()
    on = {n: Allocation(n, (DeviceResult("gpu", "gpu.nvidia.com", n, "gpu-0"),)) for n in ("h1", "h2")}
    urgent = (waiting(a_claim("urgent", "t").request(), priority=9),)
    victims = []
    for preemptible, queued in ((True, ()), (False, urgent), (True, urgent)):
        running = (Running("t", "keep", on["h1"], 0, preemptible, 0, 2), Running("t", "other", on["h2"], 0, True, 0, 1))
        result = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), running, queued), memo)
        victims.append([p.victim for p in result.preemptions])
    assert victims == [[], [("t", "other")], [("t", "keep")]]


MODELS = ("H100", "B200")


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Fleet, QuotaConfig, list[list[Any]]]:
    devices = []
    for n in range(draw(st.integers(1, 3))):
        devices += node(f"n{n}", draw(st.sampled_from(MODELS)), draw(st.integers(1, 4)))
    tenants = ["a", "b", "c"]
    quota_doc = [{"name": t, "cohort": draw(st.sampled_from(["x", "y"])), "weight": draw(st.sampled_from([1.0, 2.0])),
                  "quotas": {m: {"nominal": draw(st.integers(0, 3)),
                                 **({"borrowingLimit": b} if (b := draw(st.none() | st.integers(0, 2))) is not None
                                    else {})}
                             for m in MODELS if draw(st.booleans())}} for t in tenants]
    config = QuotaConfig() if draw(st.booleans()) else quotas(*quota_doc)
    waves = []
    for w in range(draw(st.integers(1, 3))):
        wave = []
        for i in range(draw(st.integers(1, 5))):
            builder = a_claim(f"w{w}c{i}", draw(st.sampled_from(tenants))).request(
                count=draw(st.integers(1, 2)), selectors=(draw(st.sampled_from((H100, B200))),))
            builder.annotations["claimbroker.io/priority"] = str(draw(st.integers(0, 2)))
            wave.append(builder.build())
        waves.append(wave)
    return fleet(*devices), config, waves


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_waves_settle_without_loops_within_quotas(scenario: tuple[Fleet, QuotaConfig, list[list[Any]]]) -> None:
    """No claim preempts its preemptor back, no device is held twice, no tenant past its quota. Without the
    start estimates of the claims left waiting (they come after the waves settle and change no decision; they
    were a sixth of this test's time: tests/unit/test_estimates.py checks them)."""
    f, config, waves = scenario
    result = run_waves(f, BUILTIN_CLASSES, waves, config, estimates=False)
    pairs = {(e["claim"], e["by"]) for e in result.events}
    assert not any((by, victim) in pairs for victim, by in pairs), f"preempted back and forth: {result.events}"
    assert all(e["rule"] in ("priority", "reclaim", "fair-share") for e in result.events)
    taken: Counter[tuple[str, str, str]] = Counter()
    used: Counter[tuple[str, str]] = Counter()
    flavors = Flavors(config.flavors, SelectorMemo())
    for outcome in result.outcomes:
        allocation = outcome.decision.allocation
        if allocation is None:
            continue
        taken.update(allocation.keys)
        for key in allocation.keys:
            flavor = flavors.name_of(f.by_key[key])
            assert flavor is not None
            used[(outcome.namespace, flavor)] += 1
    assert not [k for k, n in taken.items() if n > 1], "a device was allocated twice"
    if config.enforced:
        capacity = Counter(flavors.name_of(d) for d in f.devices)
        covered = Counter({m: sum(t.quotas[m].nominal for t in config.tenants.values() if m in t.quotas)
                           for m in MODELS})
        for (tenant, flavor), n in used.items():
            limit = config.tenant(tenant).limit(flavor)
            nominal = limit.nominal if limit else 0
            if limit is not None and limit.borrowing_limit is not None:
                assert n <= nominal + limit.borrowing_limit
            # what it borrows, others of its cohort lend it or nobody's quota covers: never its own quota
            cohort = config.tenant(tenant).cohort
            lent = sum(t.quotas[flavor].nominal for t in config.tenants.values()
                       if t.name != tenant and t.cohort == cohort and flavor in t.quotas)
            assert n - nominal <= lent + max(0, capacity[flavor] - covered[flavor]), (tenant, flavor, n)


@settings(max_examples=30, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_a_kept_cycle_state_matches_one_built_afresh(scenario: tuple[Fleet, QuotaConfig, list[list[Any]]],
                                                     rng: Any) -> None:
    """The state kept across cycles (usage per tenant and flavor, devices in use, claims by node and
    tenant, the queue's groups) is brought up to date from each snapshot: it equals a state built from
    that snapshot alone, and what the cycles admit never holds a device twice.

    The states built afresh share one selector memo of their own (not the kept state's): CEL results, a pure
    function of a selector and the fields of a device of this example's one fleet. Evaluating them anew for
    each afresh state was four fifths of the test's time and compared nothing more."""
    f, config, waves = scenario
    kept = KeptState()
    afresh_memo = SelectorMemo()
    shell = Waves([[arriving(c, 0) for c in wave] for wave in waves], rng)
    for _ in shell.cycles():
        snapshot = Snapshot(f, BUILTIN_CLASSES, config, tuple(shell.running.values()), tuple(shell.queue.values()))
        result = run_cycle(snapshot, kept)
        state = kept.admission
        assert state is not None
        fresh = KeptState(memo=afresh_memo).admission_for(snapshot)
        state.begin(snapshot)  # the kept state, brought back to the snapshot (the cycle moved it on)
        assert {k: n for k, n in state.book.used.items() if n} == {k: n for k, n in fresh.book.used.items() if n}
        assert state.placement.in_use == fresh.placement.in_use
        held_now, held_afresh = state.holdings, fresh.holdings
        assert {t: dict(c) for t, c in held_now.victims.items() if c} == {t: dict(c) for t, c in
                                                                        held_afresh.victims.items() if c}
        assert ({(t, f): dict(c) for t, pools in held_now.by_flavor.items() for f, c in pools.items() if c}
                == {(t, f): dict(c) for t, pools in held_afresh.by_flavor.items() for f, c in pools.items() if c})
        assert {t: +c for t, c in held_now.priorities.items() if +c} == {t: +c for t, c in
                                                                      held_afresh.priorities.items() if +c}
        assert {t: n for t, n in state.book.borrowed_count.items() if n} == {
            t: n for t, n in fresh.book.borrowed_count.items() if n}
        queue, queue_afresh = state.queue, fresh.queue
        groups = {(g.tenant, tuple(g.entries), frozenset(g.fresh)) for g in queue.groups.values()}
        assert ({t: [e for e, _ in q] for t, q in queue.tenant_heads.items() if q}
                == {t: [e for e, _ in q] for t, q in queue_afresh.tenant_heads.items() if q}
                == {t: sorted(g.entries[0] for g in queue_afresh.groups.values() if g.tenant == t)
                    for t in {g.tenant for g in queue_afresh.groups.values()}})
        assert groups == {(g.tenant, tuple(g.entries), frozenset(g.fresh)) for g in queue_afresh.groups.values()}
        shell.settle(result)
        held = Counter(k for r in shell.running.values() for k in r.allocation.keys)
        assert not [k for k, n in held.items() if n > 1], "a device was allocated twice"


def arriving(claim: Any, arrival: int) -> Waiting:
    """A scenario's claim as it joins the queue, with the priority its annotation gives."""
    return Waiting(claim.metadata.namespace, claim.metadata.name, claim,
                   int(claim.metadata.annotations.get("claimbroker.io/priority", "0")), True, arrival)


def test_claims_of_one_spec_in_many_tenants_are_each_explained_with_their_own_tenant_and_priority() -> None:
    """The parts of an explanation that claims of one spec share across tenants (capacity, suggestions)
    are worked out once per cycle; each claim still reads its own tenant's figures and its priority."""
    f = fleet(*node("n", "H100", 2))
    running = (Running("a", "r0", _allocation_on(f, "n", 2), 0, False, 0, 1),)  # not preemptible
    queue = [waiting(a_claim("wa", "a").request(selectors=(H100,)), priority=2, arrival=1),
             waiting(a_claim("wb", "b").request(selectors=(H100,)), priority=0, arrival=2)]
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), running, tuple(queue)))
    details = {d.name: d.explain for d in result.decisions}
    assert details["wa"] is not None and details["wb"] is not None
    assert (details["wa"]["tenant"]["name"], details["wa"]["priority"], details["wa"]["tenant"]["unitsInUse"]) == (
        "a", 2, 2 * _h100_value())
    assert (details["wb"]["tenant"]["name"], details["wb"]["priority"], details["wb"]["tenant"]["unitsInUse"]) == (
        "b", 0, 0)
    assert details["wa"]["capacity"] == details["wb"]["capacity"] and details["wa"]["capacity"][0]["free"] == 0
    assert details["wa"]["toAdmit"] == details["wb"]["toAdmit"] != []
    assert list(details["wa"]) == ["state", "reason", "unsatisfiable", "tenant", "priority", "flavors", "quota",
                                   "capacity", "preemption", "toAdmit"]


def _allocation_on(f: Fleet, node_name: str, count: int) -> Any:
    from shared.dra.allocation import FleetState
    claim = a_claim("probe", "a").request(count=count, selectors=(H100,)).build()
    decision = FleetState(f, BUILTIN_CLASSES, ()).decide(claim)
    assert decision.allocation is not None and decision.allocation.node == node_name
    return decision.allocation


def _h100_value() -> float:
    return next(fl.value for fl in QuotaConfig().flavors if fl.name == "H100")


def test_a_deep_queue_of_alike_claims_is_answered_once_and_taken_in_order() -> None:
    """Claims alike (one tenant, one spec) form a group: the head is tried, the rest share its answer the
    first time and keep it after; freed devices go to the earliest arrival."""
    f = fleet(*node("n", "H100", 2))
    memo = KeptState()
    queue = [waiting(a_claim(f"c{i}", "t").request(), arrival=i) for i in range(6)]
    first = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), tuple(queue)), memo)
    states = {d.name: d.decision.state for d in first.decisions}
    assert states == {"c0": State.ALLOCATED, "c1": State.ALLOCATED, **{f"c{i}": State.PENDING for i in range(2, 6)}}
    assert all("free 0 of 2" in (d.decision.reason or "") or d.decision.allocation for d in first.decisions)
    running = tuple(Running("t", d.name, d.decision.allocation, 0, True, int(d.name[1:]), int(d.name[1:]))
                    for d in first.decisions if d.decision.allocation is not None)
    answered = tuple(Waiting(w.tenant, w.name, w.claim, 0, True, w.arrival, answered=True) for w in queue[2:])
    again = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), running, answered), memo)
    assert again.decisions == ()  # nothing changed: nobody is answered again
    freed = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), running[1:], answered), memo)
    assert [(d.name, d.decision.state) for d in freed.decisions] == [("c2", State.ALLOCATED)]


def test_claims_behind_heads_refused_without_a_trial_get_one_first_answer() -> None:
    """A pass drops, without a trial, the groups of a spec no node has room for any more and the groups
    their tenant's quota keeps out; their claims still get their first answer, with the reason that
    holds (capacity, or the quota with its numbers), once."""
    f = fleet(*node("h", "H100", 2), *node("b", "B200", 1))
    config = quotas({"name": "a", "cohort": "x", "quotas": {"H100": {"nominal": 2}}},
                    {"name": "c", "cohort": "x", "quotas": {"H100": {"nominal": 1}}},
                    {"name": "b", "cohort": "y", "quotas": {"B200": {"nominal": 0, "borrowingLimit": 0}}})
    queue = [waiting(a_claim("big", "a").request(count=2, selectors=(H100,)), arrival=0),
             waiting(a_claim("c0", "c").request(selectors=(H100,)), arrival=1),  # no H100 idle now: the spec closes
             waiting(a_claim("one-0", "a").request(selectors=(H100,)), arrival=2),  # the closed spec: dropped
             waiting(a_claim("one-1", "a").request(selectors=(H100,)), arrival=3),
             waiting(a_claim("b0", "b").request(selectors=(B200,)), arrival=4),  # quota-full: dropped
             waiting(a_claim("b1", "b").request(selectors=(B200,)), arrival=5)]
    memo = KeptState()
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, (), tuple(queue)), memo)
    assert sorted(d.name for d in result.decisions) == sorted(w.name for w in queue)  # each once
    answers = {d.name: d.decision for d in result.decisions}
    assert answers["big"].state is State.ALLOCATED
    for name in ("c0", "one-0", "one-1"):
        assert answers[name].state is State.PENDING and "free 0 of 2" in (answers[name].reason or ""), name
    for name in ("b0", "b1"):
        assert answers[name].state is State.PENDING
        assert "Quota: b would borrow 1 B200 beyond its nominal 0, over its borrowingLimit of 0" in (
            answers[name].reason or ""), name
    running = (Running("a", "big", answers["big"].allocation, 0, True, 0, 1),)  # type: ignore[arg-type]
    answered = tuple(Waiting(w.tenant, w.name, w.claim, 0, True, w.arrival, answered=True) for w in queue[1:])
    again = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, running, answered), memo)
    assert again.decisions == ()  # nothing changed: nobody is answered again


@pytest.mark.parametrize(("tenants", "devices", "used", "room"), [
    ([{"name": "t", "cohort": "c", "quotas": {"H100": {"nominal": 4}}}], 4, 0, 4),  # alone: no one lends to it
    ([{"name": "t", "cohort": "c", "quotas": {"H100": {"nominal": 4}}}], 4, 3, 1),
    ([{"name": "t", "cohort": "c", "quotas": {"H100": {"nominal": 4}}}], 8, 0, 8),  # 4 nobody's quota covers
    ([{"name": "t", "cohort": "c", "quotas": {"H100": {"nominal": 4}}},
      {"name": "u", "cohort": "c", "quotas": {"H100": {"nominal": 4}}}], 8, 0, 8),  # u lends its 4
    ([{"name": "t", "cohort": "c", "quotas": {"H100": {"nominal": 4}}},
      {"name": "u", "cohort": "c", "quotas": {"H100": {"nominal": 4, "lendingLimit": 0}}}], 8, 0, 4),
    ([{"name": "t", "cohort": "c", "quotas": {"H100": {"nominal": 4, "lendingLimit": 2}}},
      {"name": "u", "cohort": "c", "quotas": {"H100": {"nominal": 4, "lendingLimit": 1}}}], 8, 2, 3),
])
def test_a_tenant_never_borrows_its_own_quota(tenants: list[dict[str, Any]], devices: int, used: int,
                                              room: int) -> None:
    """What a tenant may take is its nominal headroom plus what others of its cohort lend and the free
    capacity: the pool of lent quota also holds its own unused quota, which must not count twice."""
    book = QuotaBook(quotas(*tenants), {"H100": devices})
    for _ in range(used):
        book.add("t", "H100", 2.0)
    assert book.room("t", "H100") == room
    assert not book.check("t", {"H100": room}) if room else True
    assert book.check("t", {"H100": room + 1})


@pytest.mark.parametrize(("used", "expected"), [(0, 12), (5, 7), (8, 4), (10, 2), (12, 0), (13, 0)])
def test_room_under_a_borrowing_limit_counts_what_is_borrowed_once(used: int, expected: int) -> None:
    """nominal 8, borrowingLimit 4, unlimited lending: the tenant may hold 12 in all, whatever it holds now."""
    config = quotas({"name": "t", "cohort": "c", "quotas": {"H100": {"nominal": 8, "borrowingLimit": 4}}})
    book = QuotaBook(config, {"H100": 100})
    for _ in range(used):
        book.add("t", "H100", 2.0)
    assert book.room("t", "H100", lent_only=False) == expected
    assert not book.check("t", {"H100": expected}) if expected else book.check("t", {"H100": 1})


@pytest.mark.parametrize(("u_holds", "t_h100_nominal", "count", "may"), [
    (4, 4, 1, False),  # room for H100 but none idle; B200 idle but no room for it
    (3, 4, 1, True),  # one H100 idle, and room for it
    (3, 4, 2, False),  # one H100 idle is too few for two
    (2, 4, 2, True),
    (2, 1, 2, False),  # two H100 idle, room for one (t's cohort lends nothing)
    (0, 0, 1, False),  # all idle, no room anywhere
])
def test_a_placement_needs_room_and_idle_devices_of_one_flavor_set(u_holds: int, t_h100_nominal: int, count: int,
                                                                 may: bool) -> None:
    """`quota_short(..., idle=True)` (asked before placements that would be wasted) sums, over the flavors a
    claim accepts, the lesser of the tenant's room and the idle devices: room in a flavor nobody has idle
    and idle devices of a flavor it has no room in do not add up to a placement."""
    f = fleet(*node("h", "H100", 4), *node("b", "B200", 4))
    config = quotas({"name": "t", "cohort": "x", "quotas": {"H100": {"nominal": t_h100_nominal},
                                                           "B200": {"nominal": 0, "borrowingLimit": 0}}},
                    {"name": "u", "cohort": "y", "quotas": {"H100": {"nominal": 4 - t_h100_nominal},
                                                           "B200": {"nominal": 4}}})
    running = tuple(Running("u", f"u{i}", Allocation("h", (DeviceResult("gpu", "gpu.nvidia.com", "h", f"gpu-{i}"),)),
                            0, True, i, i)
                    for i in range(u_holds))
    claim = waiting(a_claim("any", "t").request(count=count))
    memo = KeptState()
    run_cycle(Snapshot(f, BUILTIN_CLASSES, config, running, ()), memo)
    cycle = memo.admission
    assert cycle is not None
    facts = cycle.room.plan_facts(cycle.placement.plan(claim.claim))
    assert facts.flavors == {"H100", "B200"}
    assert (cycle.room.quota_short("t", facts, idle=True) is None) is may
    assert cycle.book.idle("H100") == 4 - u_holds and cycle.book.idle("B200") == 4
