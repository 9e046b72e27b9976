"""The contract's quota invariants (shared/admission/invariant.py) after every cycle of random waves over
random fleets (whole GPUs, static and dynamic MIG), cohorts and quotas; and the reported scenario, a
cohort over its members' nominal quota, as table rows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.admission.cycle import run_cycle
from shared.admission.flavors import Flavors
from shared.admission.invariant import held_per_flavor, violations
from shared.admission.kept import KeptState
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig, parse_quotas
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.dra.matching import SelectorMemo
from shared.dra.results import Allocation, DeviceResult, State
from shared.fleet.sources import documents_from
from tests.builders import a_claim, fleet, node
from tests.waves import Waves

MODELS = ("H100", "A100")
LAYOUTS = ("all-1g.10gb", "all-balanced", "all-3g.40gb", ["2g.20gb", "3g.40gb"], "dynamic")
FLAVORS = ("H100", "A100", "H100-1g.10gb", "A100-1g.10gb", "H100-3g.40gb", "A100-2g.20gb", "H100-2g.20gb")
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")
TENANTS = ("t0", "t1", "t2", "t3", "t4")
# Selector results depend only on the selector and the device fields it reads, never on the fleet: kept
# across examples (cel-python's evaluations would be most of the run's time otherwise).
SHARED = SelectorMemo()
FLAVOR_OF = Flavors(QuotaConfig().flavors, SHARED)


def memo() -> KeptState:
    """Fresh kept state for a run (none from another fleet) that shares the selector results."""
    return KeptState(SelectorMemo(results=SHARED.results, signatures=SHARED.signatures, shapes=SHARED.shapes))


def product(model: str) -> str:
    return f'device.attributes["gpu.nvidia.com"].productName == "{model}"'


def profile(name: str) -> str:
    return f'device.attributes["gpu.nvidia.com"].profile == "{name}"'


def topology_fleet(nodes: list[dict[str, Any]]) -> Fleet:
    docs = documents_from([{"kind": "Topology", "nodes": nodes}], "test")
    return Fleet.from_slices(docs.slices, docs.labels)


@st.composite
def node_specs(draw: Any) -> list[dict[str, Any]]:
    """One to four nodes of H100 or A100; some GPUs carved into MIG, statically or as DynamicMIG (a
    whole GPU and all its partitions drawing on shared counters)."""
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        count = draw(st.integers(1, 8))
        model = draw(st.sampled_from(("H100", "H100", "A100")))
        spec: dict[str, Any] = {"name": f"n{i}", "gpuModel": model, "gpuCount": count}
        mig = {g: draw(st.sampled_from(LAYOUTS)) for g in range(count) if draw(st.integers(0, 5)) == 0}
        if mig:
            spec["mig"] = mig
        nodes.append(spec)
    return nodes


@st.composite
def quota_configs(draw: Any, capacity: Counter[str]) -> QuotaConfig:
    """Cohorts of one to three members (or none), some tenants without quota. Mostly each flavor's
    devices are split among nominal quotas, all of them or all but one or two (so cohorts borrow and lend
    and a cohort that takes more than its nominal takes another cohort's idle devices); else nominal
    quotas are drawn at random (more or fewer than there are devices)."""
    names = [t for t in TENANTS if draw(st.integers(0, 4))]  # the rest have no quota at all
    quotas: dict[str, dict[str, Any]] = {t: {} for t in names}
    for flavor in FLAVORS:
        holders = [t for t in names if draw(st.integers(0, 2))]
        if not holders:
            continue
        if draw(st.integers(0, 3)):
            left = max(0, capacity[flavor] - draw(st.integers(0, 2)))
            cuts = sorted(draw(st.integers(0, left)) for _ in holders[1:])
            nominals = [b - a for a, b in zip([0, *cuts], [*cuts, left], strict=True)]
        else:
            nominals = [draw(st.integers(0, 10)) for _ in holders]
        for tenant, nominal in zip(holders, nominals, strict=True):
            limit: dict[str, Any] = {"nominal": nominal}
            if draw(st.integers(0, 2)) == 0:
                limit["borrowingLimit"] = draw(st.integers(0, 4))
            if draw(st.integers(0, 2)) == 0:
                limit["lendingLimit"] = draw(st.integers(0, nominal))
            quotas[tenant][flavor] = limit
    tenants = []
    for name in names:
        cohort = draw(st.sampled_from((None, "c0", "c0", "c1", "c1")))
        tenants.append({"name": name, **({"cohort": cohort} if cohort else {}), "quotas": quotas[name]})
    return parse_quotas({"kind": "Quotas", "tenants": tenants})


@st.composite
def claims(draw: Any, name: str) -> Waiting:
    """ExactCount 1 to 8 of a class, whole GPUs of a model or any, MIG slices of a profile or any; some
    take both at once (devices of several flavors)."""
    builder = a_claim(name, draw(st.sampled_from(TENANTS)))
    for r in range(draw(st.sampled_from((1, 1, 1, 2)))):
        count = draw(st.sampled_from((1, 1, 2, 2, 3, 4, 6, 8)))
        if draw(st.integers(0, 2)):
            model = draw(st.sampled_from((None, *MODELS)))
            builder.request(f"r{r}", count=count, selectors=(product(model),) if model else ())
        else:
            wanted = draw(st.sampled_from((None, *PROFILES)))
            builder.request(f"r{r}", cls="mig.nvidia.com", count=count, selectors=(profile(wanted),) if wanted else ())
    claim = builder.build()
    return Waiting(claim.metadata.namespace or "default", name, claim, draw(st.integers(0, 2)),
                   draw(st.integers(0, 3)) > 0, 0)


@dataclass
class Scenario:
    """What a failing example prints: the Topology nodes, the Quotas and each wave's claims, readable."""

    nodes: list[dict[str, Any]]
    quotas: QuotaConfig
    waves: list[list[Waiting]]
    fleet: Fleet = field(repr=False)

    def __repr__(self) -> str:
        def claim(w: Waiting) -> str:
            requests = [f"{r.exactly.count} {r.exactly.device_class_name}"
                        + "".join(f" [{s.cel.expression.split('==')[-1].strip()}]" for s in r.exactly.selectors)
                        for r in w.claim.spec.devices.requests if r.exactly is not None]
            return (f"{w.tenant}/{w.name}: {' + '.join(requests)}, priority {w.priority}"
                    + ("" if w.preemptible else ", not preemptible"))

        lines = ["nodes:", *(f"  {n}" for n in self.nodes), "tenants:",
                 *(f"  {t}" for t in self.quotas.to_document()["tenants"])]
        for i, wave in enumerate(self.waves):
            lines += [f"wave {i + 1}:", *(f"  {claim(w)}" for w in wave)]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how hypothesis prints a failing example
        printer.text(repr(self))


@st.composite
def scenarios(draw: Any) -> Scenario:
    nodes = draw(node_specs())
    f = topology_fleet(nodes)
    capacity = Counter(name for d in f.devices if (name := FLAVOR_OF.name_of(d)) is not None)
    waves = [[draw(claims(f"w{w}c{i}")) for i in range(draw(st.integers(1, 8)))]
             for w in range(draw(st.integers(2, 5)))]
    return Scenario(nodes, draw(quota_configs(capacity)), waves, f)


@pytest.mark.timeout(900)  # a failure shrinks for up to five minutes (many cycles an example) before it is shown
@settings(max_examples=400, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_no_cycle_breaks_a_quota_invariant(scenario: Scenario, rng: Any) -> None:
    """After every cycle: no device (nor shared counter) twice, no tenant over its nominal plus its
    borrowingLimit, no cohort over its members' nominal plus the free capacity, no kept quota lent."""
    f, config, waves = scenario.fleet, scenario.quotas, scenario.waves
    kept, flavors = memo(), Flavors(config.flavors, SHARED)
    shell = Waves(waves, rng)
    for cycle, _ in enumerate(shell.cycles()):
        snapshot = Snapshot(f, BUILTIN_CLASSES, config, tuple(shell.running.values()), tuple(shell.queue.values()))
        shell.settle(run_cycle(snapshot, kept))
        found = violations(f, config, shell.running.values(), flavors)
        assert not found, (f"cycle {cycle + 1}: {found}; held {held_per_flavor(f, shell.running.values(), flavors)}"
                           f"\n{scenario!r}")


# -- the reported scenario: every GPU covered by nominal quota, t3 borrows what its cohort-mate t4 lends,
# then t4 takes back part of its nominal quota (the report: t3 used 42 H100, borrowing 2, while t4 lent 1,
# and the cohort held 81 of its 80) -----------------------------------------------------------------------


def _quotas(*, t4_lending: int | None = None, t3_weight: float = 1.0) -> QuotaConfig:
    t4: dict[str, Any] = {"nominal": 8}
    if t4_lending is not None:
        t4["lendingLimit"] = t4_lending
    return parse_quotas({"kind": "Quotas", "tenants": [
        {"name": "t3", "cohort": "research", "weight": t3_weight, "quotas": {"H100": {"nominal": 8}}},
        {"name": "t4", "cohort": "research", "quotas": {"H100": t4}},
        {"name": "t5", "cohort": "other", "quotas": {"H100": {"nominal": 8}}},  # idle: its GPUs are free
    ]})


def _wait(name: str, tenant: str, count: int, *, preemptible: bool = True, arrival: int = 0) -> Waiting:
    claim = a_claim(name, tenant).request(count=count, selectors=(product("H100"),)).build()
    return Waiting(tenant, name, claim, 0, preemptible, arrival)


@dataclass
class Row:
    gpus: int  # H100 in the fleet (8 per node); 24 are covered by nominal quota
    quotas: QuotaConfig
    first: list[Waiting]  # run before: t4 within its nominal, t3 borrowing from t4
    then: Waiting  # t4 asks for more, within its nominal
    expect: str  # the state of `then` after its cycle
    held: dict[str, int]  # H100 per tenant after it
    preempted: list[tuple[str, str]] = field(default_factory=list)  # (victim, rule)
    reason: str | None = None  # part of the Pending reason


BORROWS = [_wait("t4-a", "t4", 6, arrival=1), _wait("t3-a", "t3", 8, arrival=2), _wait("t3-b", "t3", 2, arrival=3)]
ROWS = {
    # t4's unused 2 are lent to t3; t4 wants 1 of them back: it reclaims (t3's borrowed claim is evicted),
    # not admitted beside it (which was the bug: 17 of 16, with t5's idle GPUs)
    "mate-takes-back-lent-quota-by-reclaim": Row(
        24, _quotas(), BORROWS, _wait("t4-b", "t4", 1, arrival=4), "Allocated",
        {"t3": 8, "t4": 7}, preempted=[("t3-b", "reclaim")]),
    # reclaim does not weigh shares: t3's share (10 H100 over weight 4) is below t4's (6 over 1)
    "mate-reclaims-from-a-borrower-with-a-lower-share": Row(
        24, _quotas(t3_weight=4), BORROWS, _wait("t4-b", "t4", 1, arrival=4), "Allocated",
        {"t3": 8, "t4": 7}, preempted=[("t3-b", "reclaim")]),
    "mate-waits-when-the-borrower-cannot-be-preempted": Row(
        24, _quotas(), [replace(w, preemptible=False) for w in BORROWS], _wait("t4-b", "t4", 1, arrival=4),
        "Pending", {"t3": 10, "t4": 6}, reason="its cohort borrows 2 of the quota it lends: only 0 more"),
    # free capacity (2 H100 beyond every nominal quota) backs it: no preemption needed
    "mate-takes-free-capacity": Row(
        26, _quotas(), BORROWS, _wait("t4-b", "t4", 1, arrival=4), "Allocated", {"t3": 10, "t4": 7}),
    # what t4 keeps (lendingLimit 2: it keeps 6) is never lent: t3 may not borrow 3 of t4's 4 unused, and
    # t4's kept quota is there when it asks
    "kept-quota-is-never-lent": Row(
        24, _quotas(t4_lending=2), [_wait("t4-a", "t4", 4, arrival=1), BORROWS[1], _wait("t3-b", "t3", 3, arrival=3)],
        _wait("t4-b", "t4", 2, arrival=4), "Allocated", {"t3": 8, "t4": 6}),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=list(ROWS))
def test_a_cohort_never_holds_more_than_its_nominal_plus_free_capacity(row: Row) -> None:
    f = fleet(*(d for i in range(row.gpus // 8) for d in node(f"h{i}", "H100", 8)),
              *node("spare", "H100", row.gpus % 8))
    flavors, memo = Flavors(row.quotas.flavors, SelectorMemo()), KeptState()
    running: dict[tuple[str, str], Running] = {}
    result = None
    for batch in (row.first, [*row.first, row.then]):  # the borrowing first, then t4's claim
        waiting = tuple(w for w in batch if w.key not in running)
        result = run_cycle(Snapshot(f, BUILTIN_CLASSES, row.quotas, tuple(running.values()), waiting), memo)
        for p in result.preemptions:
            del running[p.victim]
        for d in result.decisions:
            if d.decision.allocation is not None:
                w = next(w for w in batch if w.key == (d.tenant, d.name))
                running[w.key] = Running(w.tenant, w.name, d.decision.allocation, w.priority, w.preemptible,
                                         w.arrival, len(running) + 1)
        assert violations(f, row.quotas, running.values(), flavors) == []
    assert result is not None
    decision = next(d.decision for d in result.decisions if d.name == row.then.name)
    assert decision.state.value == row.expect, decision.reason
    if row.reason is not None:
        assert row.reason in (decision.reason or "")
    assert [(p.victim[1], p.rule) for p in result.preemptions] == row.preempted
    held = held_per_flavor(f, running.values(), flavors)
    assert {t: h.get("H100", 0) for t, h in held.items()} == row.held


def test_the_shrunk_example() -> None:
    """What the property found first, shrunk by hand: 4 A100, 3 of them t1's nominal quota (idle) and 1
    t2's; t0, t2's cohort-mate with no nominal, borrows t2's A100; then t2 asks for its own. It waits (t0's
    claim cannot be preempted) instead of taking one of t1's idle A100: the cohort would hold 2 of its 1."""
    f = fleet(*node("n0", "A100", 4))
    config = parse_quotas({"kind": "Quotas", "tenants": [
        {"name": "t0", "cohort": "c0", "quotas": {"A100": {"nominal": 0, "borrowingLimit": 1}}},
        {"name": "t1", "quotas": {"A100": {"nominal": 3}}},
        {"name": "t2", "cohort": "c0", "quotas": {"A100": {"nominal": 1}}}]})
    borrower = Waiting("t0", "a", a_claim("a", "t0").request().build(), 0, False, 1)
    first = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, (), (borrower,)))
    allocation = first.decisions[0].decision.allocation
    assert allocation is not None
    running = (Running("t0", "a", allocation, 0, False, 1, 1),)
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, config, running, (
        Waiting("t2", "b", a_claim("b", "t2").request().build(), 0, True, 2),)))
    (decided,) = result.decisions
    decision = decided.decision
    assert decision.state is State.PENDING and not result.preemptions
    assert "t2 is within its nominal 1 A100 (in use 0), but its cohort borrows 1" in (decision.reason or "")
    assert decided.explain is not None and decided.explain["toAdmit"][0].startswith(
        "wait for t0 (1) to return borrowed A100: reclaim preempts")  # not "raise t2's nominal from 1 to 1"


def _run(tenant: str, name: str, taken: list[tuple[str, str, str]]) -> Running:
    return Running(tenant, name, Allocation(taken[0][1], tuple(DeviceResult("gpu", *k) for k in taken)))


def test_the_checker_reports_each_invariant() -> None:
    """The checker itself, on the report's figures scaled down: t3 holds 10 (borrowing 2), t4 holds 7 of
    its 8, every GPU covered by nominal quota: the cohort holds 17 of its 16. And a device held twice, a
    borrowingLimit and a lendingLimit passed."""
    f = fleet(*node("h0", "H100", 8), *node("h1", "H100", 8), *node("h2", "H100", 8))
    keys = [d.key for d in f.devices]
    running = [_run("t3", "a", keys[:8]), _run("t3", "b", keys[8:10]), _run("t4", "c", keys[16:23])]
    assert violations(f, _quotas(), running) == [
        "cohort research holds 17 H100, over its members' nominal 16 plus the free capacity 0",
        "cohorts use 1 H100 beyond their nominal, over the free capacity 0"]
    assert violations(f, _quotas(), running[:1] + running[2:]) == []
    assert violations(f, _quotas(), [*running, _run("t5", "d", keys[:1])])[0] == (
        "device gpu.nvidia.com/h0/gpu-0 is held by t3/a and t5/d")
    capped = parse_quotas({"kind": "Quotas", "tenants": [
        {"name": "t3", "cohort": "research", "quotas": {"H100": {"nominal": 8, "borrowingLimit": 1}}},
        {"name": "t4", "cohort": "research", "quotas": {"H100": {"nominal": 8, "lendingLimit": 2}}},
        {"name": "t5", "cohort": "other", "quotas": {"H100": {"nominal": 8}}}]})
    # t3 borrows 2 of the 4 t4 does not use, within the cohort's 16 but past t3's borrowingLimit of 1
    assert violations(f, capped, [running[0], running[1], _run("t4", "c", keys[16:20])]) == [
        "tenant t3 holds 10 H100, over its nominal 8 plus its borrowingLimit 1"]
    # t5 borrows 3 of its cohort-mate t4's unused 6: 1 more than t4 lends (2), within the cohort's nominal
    lent = parse_quotas({"kind": "Quotas", "tenants": [
        {"name": "t4", "cohort": "research", "quotas": {"H100": {"nominal": 8, "lendingLimit": 2}}},
        {"name": "t5", "cohort": "research", "quotas": {"H100": {"nominal": 8}}},
        {"name": "t6", "quotas": {"H100": {"nominal": 8}}}]})
    assert violations(f, lent, [_run("t4", "c", keys[16:18]), _run("t5", "a", keys[:8]),
                                _run("t5", "b", keys[8:11])]) == [
        "cohorts use 1 H100 beyond what their members keep and lend (lendingLimit), over the free capacity 0"]
