"""Start estimates (issue 39): `estimate_starts` runs the decision core forward from a snapshot on a fake clock.
Table rows drive it through its public entry point; the issue's cases first (four busy GPUs that end at 10,
20, 30 and 40 minutes), then a property over random small fleets and queues."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.admission.cycle import run_cycle
from shared.admission.estimates import (
    UNSATISFIABLE,
    Estimate,
    EstimateMemo,
    Quantiles,
    Runtimes,
    estimate_starts,
)
from shared.admission.model import Running, Snapshot, Waiting
from shared.admission.quota import QuotaConfig, parse_quotas
from shared.admission.simulate import SIMULATION_START
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from tests.builders import a_claim, fleet, node

T0 = SIMULATION_START
MINUTE = 60.0
FOUR = fleet(*node("n1", "H100", 4))


def claim(name: str, tenant: str = "vision", count: int = 1, *, priority: int = 0, runtime: str | None = None,
          gang: tuple[str, int] | None = None, selectors: tuple[str, ...] = (), arrival: int = 100,
          preemptible: bool = True) -> Waiting:
    builder = a_claim(name, tenant).request(count=count, selectors=selectors)
    if runtime is not None:
        builder.annotations["claimbroker.io/expected-runtime"] = runtime
    if gang is not None:
        builder.gang(*gang)
    return Waiting(tenant, name, builder.build(), priority, preemptible, arrival)


def running(f: Fleet, *claims: Waiting, since: float = T0) -> tuple[Running, ...]:
    """The claims admitted by the core on an empty fleet, each allocated at `since`, as the ledger reads them."""
    result = run_cycle(Snapshot(f, BUILTIN_CLASSES, QuotaConfig(), (), claims))
    by_name = {w.name: w for w in claims}
    out = []
    for order, d in enumerate(result.decisions, start=1):
        assert d.decision.allocation is not None, d.decision.reason
        w = by_name[d.name]
        raw = w.claim.metadata.annotations.get("claimbroker.io/expected-runtime")
        seconds = float(raw.removesuffix("m")) * MINUTE if raw else None
        out.append(Running(w.tenant, w.name, d.decision.allocation, w.priority, w.preemptible, w.arrival, order,
                           since, None, seconds))
    return tuple(out)


def busy(*minutes: int | None, tenant: str = "lab", preemptible: bool = False) -> tuple[Running, ...]:
    """One GPU each of FOUR, ending that many minutes after T0 (None: its runtime is not known)."""
    return running(FOUR, *(claim(f"busy-{i}", tenant, runtime=f"{m}m" if m else None, arrival=i,
                                 preemptible=preemptible) for i, m in enumerate(minutes)))


BUSY = busy(10, 20, 30, 40)


@dataclass
class Case:
    running: tuple[Running, ...]
    waiting: list[Waiting]
    expect: dict[str, float | None]  # claim name -> p50 in minutes after now (None: no estimate)
    now: float = T0
    quotas: QuotaConfig = field(default_factory=QuotaConfig)
    runtimes: Runtimes = field(default_factory=Runtimes)
    blocked_by: dict[str, tuple[str, ...]] = field(default_factory=dict)
    reason_has: dict[str, str] = field(default_factory=dict)
    p90: dict[str, float | None] = field(default_factory=dict)  # minutes, where it differs from p50


def lab_min_runtime(minutes: int) -> QuotaConfig:
    return parse_quotas({"kind": "Quotas", "tenants": [{"name": "lab", "minRuntime": f"{minutes}m"}]})


CASES = {
    "a-2-gpu-claim-starts-when-the-second-busy-gpu-frees": Case(
        BUSY, [claim("two", count=2)], {"two": 20}, blocked_by={"two": ("lab/busy-0", "lab/busy-1")}),
    "a-1-gpu-claim-takes-the-first": Case(BUSY, [claim("one")], {"one": 10}, blocked_by={"one": ("lab/busy-0",)}),
    "an-early-release-lowers-it": Case(  # at 00:05 busy-1 was released: what is left frees at 10, 30, 40
        tuple(r for r in BUSY if r.name != "busy-1"), [claim("two", count=2)], {"two": 5}, now=T0 + 5 * MINUTE,
        blocked_by={"two": ("lab/busy-0",)}),
    "a-higher-priority-arrival-of-its-tenant-pushes-it-back": Case(
        BUSY, [claim("two", count=2, runtime="60m"), claim("urgent", count=2, priority=5, arrival=200,
                                                            runtime="60m")],
        {"urgent": 20, "two": 40}, blocked_by={"two": ("lab/busy-2", "lab/busy-3")}),
    "the-claims-ahead-run-their-expected-runtime-then-free-it": Case(
        BUSY, [claim("first", count=4, runtime="15m"), claim("second", count=4, arrival=101)],
        {"first": 40, "second": 55}, blocked_by={"second": ("vision/first",)}),
    "a-gang-waits-for-its-last-member": Case(
        BUSY, [claim("a", gang=("g", 2))], {"a": None},
        blocked_by={"a": ("gang g: 1 member missing",)}, reason_has={"a": "gang g: 1 of 2 members received"}),
    "a-complete-gang-starts-whole-when-both-fit": Case(
        BUSY, [claim("a", gang=("g", 2)), claim("b", gang=("g", 2), arrival=101)], {"a": 20, "b": 20}),
    # busy claims of unknown runtime: vision's claim starts only by preempting one for fair share, which lab's
    # minRuntime forbids until it ends
    "min-runtime-the-victim-protects-is-when-it-starts": Case(
        busy(None, None, None, None, preemptible=True), [claim("fair")], {"fair": 15},
        quotas=lab_min_runtime(15), blocked_by={"fair": ("lab/busy-3",)}),
    "min-runtime-already-over-preempts-now": Case(
        busy(None, None, None, None, preemptible=True), [claim("fair")], {"fair": 0},
        now=T0 + 20 * MINUTE, quotas=lab_min_runtime(15)),
    "an-end-before-min-runtime-ends-comes-first": Case(
        busy(None, 5, None, None, preemptible=True), [claim("fair")], {"fair": 5},
        quotas=lab_min_runtime(15), blocked_by={"fair": ("lab/busy-1",)}),
    "a-claim-no-device-could-ever-satisfy": Case(
        BUSY, [claim("b300", selectors=('device.attributes["gpu.nvidia.com"].productName == "B300"',))],
        {"b300": None}, reason_has={"b300": UNSATISFIABLE}),
    "more-gpus-than-any-node-has": Case(BUSY, [claim("eight", count=8)], {"eight": None},
                                        reason_has={"eight": UNSATISFIABLE}),
    "unknown-runtimes-never-end-within-the-horizon": Case(
        busy(None, None, None, None), [claim("one")], {"one": None},
        reason_has={"one": "does not start within 7d of the claims running now"}),
    "observed-runtimes-stand-in-for-an-annotation": Case(
        busy(None, None, None, None), [claim("one")], {"one": 30}, p90={"one": 90},
        runtimes=Runtimes(by_tenant={"lab": Quantiles(30 * MINUTE, 90 * MINUTE)})),
    "a-running-claim-past-its-expected-end-ends-no-sooner-than-now": Case(
        BUSY, [claim("two", count=2)], {"two": 0}, now=T0 + 25 * MINUTE),
    "what-fits-now-starts-now": Case(busy(10, 20), [claim("two", count=2)], {"two": 0}, blocked_by={"two": ()}),
}


def minutes(at: float | None, now: float) -> float | None:
    return None if at is None else round((at - now) / MINUTE, 3)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_estimates(case: Case) -> None:
    snapshot = Snapshot(FOUR, BUILTIN_CLASSES, case.quotas, case.running, tuple(case.waiting), now=case.now)
    estimates = estimate_starts(snapshot, case.runtimes)
    assert set(estimates) == {w.key for w in case.waiting}
    got = {key[1]: minutes(e.p50, case.now) for key, e in estimates.items()}
    assert got == case.expect
    by_name = {key[1]: e for key, e in estimates.items()}
    for name, expected_p90 in {**case.expect, **case.p90}.items():
        assert minutes(by_name[name].p90, case.now) == expected_p90, name
    for name, blockers in case.blocked_by.items():
        assert by_name[name].blocked_by == blockers, name
    for name, part in case.reason_has.items():
        assert part in (by_name[name].reason or ""), by_name[name]
    for name, estimate in by_name.items():
        assert (estimate.p50 is None) == (estimate.reason is not None), name  # a reason exactly when no estimate


def test_a_snapshot_without_now_is_refused() -> None:
    with pytest.raises(ValueError, match="now"):
        estimate_starts(Snapshot(FOUR, BUILTIN_CLASSES, QuotaConfig(), BUSY, (claim("one"),)), Runtimes())


@pytest.mark.parametrize(("runtimes", "tenant", "flavors", "expected", "got"), [
    (Runtimes(), "t", (), None, None),
    (Runtimes(default=Quantiles(60, 120)), "t", (), None, Quantiles(60, 120)),
    (Runtimes(by_tenant={"t": Quantiles(5, 9)}, default=Quantiles(60, 120)), "t", (), None, Quantiles(5, 9)),
    (Runtimes(by_tenant={"t": Quantiles(5, 9)}, default=Quantiles(60, 120)), "u", (), None, Quantiles(60, 120)),
    (Runtimes(by_flavor={("t", "H100"): Quantiles(7, 8)}, by_tenant={"t": Quantiles(5, 9)}), "t", ("H100",), None,
     Quantiles(7, 8)),
    (Runtimes(by_flavor={("t", "H100"): Quantiles(7, 8)}, by_tenant={"t": Quantiles(5, 9)}), "t", ("A100",), None,
     Quantiles(5, 9)),
    (Runtimes(by_flavor={("t", "H100"): Quantiles(7, 8), ("t", "A100"): Quantiles(70, 80)}), "t",
     ("H100", "A100"), None, Quantiles(70, 80)),
    (Runtimes(by_flavor={("t", "H100"): Quantiles(7, 8)}, default=Quantiles(60, 120)), "t", ("H100",), 30.0,
     Quantiles(30, 30)),
])
def test_runtimes_an_annotation_then_the_flavor_then_the_tenant_then_the_default(
        runtimes: Runtimes, tenant: str, flavors: tuple[str, ...], expected: float | None,
        got: Quantiles | None) -> None:
    assert runtimes.of(tenant, flavors, expected) == got


OBSERVED = Quantiles(30 * MINUTE, 90 * MINUTE)


@pytest.mark.parametrize(("runtime", "ran", "upper", "ends_after"), [
    (OBSERVED, 0.0, False, 30.0),  # just started: the quantiles themselves
    (OBSERVED, 0.0, True, 90.0),
    (OBSERVED, 45.0, False, 70.6),  # past the p50 already: the median of the runs that ran 45 min
    (OBSERVED, 45.0, True, 147.1),
    (OBSERVED, 10.0, False, 33.4),  # a short while in: a little later
    (Quantiles(20 * MINUTE, 20 * MINUTE), 45.0, False, 45.0),  # one runtime (an annotation) past: ends now
])
def test_a_running_claim_ends_as_the_runs_that_ran_as_long(runtime: Quantiles, ran: float, upper: bool,
                                                          ends_after: float) -> None:
    """Minutes after its allocation: a lognormal through the observed p50 and p90, given it still runs."""
    now = T0 + ran * MINUTE
    assert (runtime.end(T0, now, upper=upper) - T0) / MINUTE == pytest.approx(ends_after, abs=0.1)


@pytest.mark.parametrize("annotation", [None, "10m"])
def test_a_claim_behind_runs_past_their_p50_or_annotation_does_not_start_now(annotation: str | None) -> None:
    """Four busy GPUs of lab running 45 min (none, or each annotated 10 min): the claim behind them starts when
    the runs of lab's observed runtimes that ran 45 min end, not at once (as their unconditioned p50 said)."""
    ahead = running(FOUR, *(claim(f"busy-{i}", "lab", runtime=annotation, arrival=i, preemptible=False)
                            for i in range(4)))
    now = T0 + 45 * MINUTE
    [estimate] = estimate_starts(Snapshot(FOUR, BUILTIN_CLASSES, QuotaConfig(), ahead, (claim("one"),), now=now),
                                 Runtimes(by_tenant={"lab": OBSERVED})).values()
    assert estimate.p50 == pytest.approx(OBSERVED.end(T0, now, upper=False))
    assert estimate.p90 == pytest.approx(OBSERVED.end(T0, now, upper=True))
    assert (estimate.p50 - now) / MINUTE == pytest.approx(25.6, abs=0.1)


def test_blocked_by_names_four_then_counts_the_rest() -> None:
    """An 8-GPU claim behind eight 1-GPU claims that end one minute apart."""
    eight = fleet(*node("n1", "H100", 8))
    ahead = running(eight, *(claim(f"c{i}", "lab", runtime=f"{i + 1}m", arrival=i, preemptible=False)
                             for i in range(8)))
    [estimate] = estimate_starts(Snapshot(eight, BUILTIN_CLASSES, QuotaConfig(), ahead, (claim("all", count=8),),
                                          now=T0), Runtimes()).values()
    assert estimate.blocked_by == ("lab/c0", "lab/c1", "lab/c2", "lab/c3", "and 4 more")
    assert estimate.to_json() == {"p50": "2026-01-01T00:08:00Z", "p90": "2026-01-01T00:08:00Z",
                                  "blockedBy": ["lab/c0", "lab/c1", "lab/c2", "lab/c3", "and 4 more"]}


def test_an_estimate_without_a_start_is_null_in_json() -> None:
    assert Estimate(None, None, (), "why").to_json() is None


# ---- a property: p90 is never before p50, and no estimate is before now -----------------------------------

@st.composite
def scenes(draw: Any) -> tuple[Snapshot, Runtimes, int]:
    nodes = draw(st.integers(1, 3))
    f = fleet(*(d for i in range(nodes) for d in node(f"n{i}", "H100", draw(st.integers(1, 4)))))
    size = sum(len(n.devices) for n in f.nodes.values())
    busy_claims = [claim(f"r{i}", draw(st.sampled_from(("a", "b"))), runtime=draw(st.sampled_from((None, "5m",
                   "30m", "90m"))), priority=draw(st.integers(0, 2)), arrival=i,
                   preemptible=draw(st.booleans())) for i in range(draw(st.integers(0, size)))]
    ahead = running(f, *busy_claims, since=T0 - draw(st.sampled_from((0.0, 600.0, 3600.0))))
    waiting = tuple(claim(f"w{i}", draw(st.sampled_from(("a", "b"))), draw(st.integers(1, 4)),
                          priority=draw(st.integers(0, 2)), arrival=100 + i,
                          runtime=draw(st.sampled_from((None, "10m", "60m")))) for i in range(draw(st.integers(1, 6))))
    config = draw(st.sampled_from((QuotaConfig(), lab_min_runtime(10), parse_quotas(
        {"kind": "Quotas", "tenants": [{"name": "a", "minRuntime": "20m"}, {"name": "b"}]}))))
    p50 = draw(st.sampled_from((60.0, 600.0, 3600.0)))
    runtimes = Runtimes(default=draw(st.sampled_from((None, Quantiles(p50, p50 * draw(st.sampled_from((1.0, 2.0,
                                                                                                       5.0))))))))
    exact = draw(st.sampled_from((1, 2, 300)))  # 1 and 2: the rest extrapolated
    return Snapshot(f, BUILTIN_CLASSES, config, ahead, waiting, now=T0), runtimes, exact


@settings(max_examples=60, deadline=None)
@given(scenes())
def test_p90_is_never_before_p50_and_nothing_starts_before_now(scene: tuple[Snapshot, Runtimes, int]) -> None:
    snapshot, runtimes, exact = scene
    estimates = estimate_starts(snapshot, runtimes, exact=exact)
    assert set(estimates) == {w.key for w in snapshot.waiting}
    for estimate in estimates.values():
        if estimate.p50 is None:
            assert estimate.p90 is None and estimate.reason
            continue
        assert estimate.p50 >= T0
        assert estimate.p90 is None or estimate.p90 >= estimate.p50


def test_claims_past_the_exact_admissions_are_extrapolated_from_the_ends_to_come() -> None:
    """With exact=1 the core admits the first claim (at busy-0's end, 10m); the rest take the devices that free
    after it in turn: busy-1's at 20m, busy-2's at 30m, then the first claim's own at 10m + 15m = 25m comes
    before busy-2's, so the third starts at 25m."""
    waiting = (claim("w1", runtime="15m"), claim("w2", runtime="15m", arrival=101),
               claim("w3", runtime="15m", arrival=102))
    estimates = estimate_starts(Snapshot(FOUR, BUILTIN_CLASSES, QuotaConfig(), BUSY, waiting, now=T0), Runtimes(),
                                exact=1)
    assert {k[1]: minutes(e.p50, T0) for k, e in estimates.items()} == {"w1": 10, "w2": 20, "w3": 25}
    assert estimates[("vision", "w3")].blocked_by == ("vision/w1",)
    exact = estimate_starts(Snapshot(FOUR, BUILTIN_CLASSES, QuotaConfig(), BUSY, waiting, now=T0), Runtimes())
    assert {k[1]: minutes(e.p50, T0) for k, e in exact.items()} == {"w1": 10, "w2": 20, "w3": 25}


def test_a_memo_kept_between_calls_gives_what_a_cold_call_gives() -> None:
    """The shell keeps an EstimateMemo: the next call goes on from the last run's state, brought back to its own
    snapshot (at 00:01 busy-1 was released, so `one` starts now, and a 3-GPU claim came)."""
    waiting = (claim("two", count=2, runtime="30m"), claim("one", runtime="10m", arrival=101))
    memo = EstimateMemo()
    first = Snapshot(FOUR, BUILTIN_CLASSES, QuotaConfig(), BUSY, waiting, now=T0)
    assert estimate_starts(first, Runtimes(), memo=memo) == estimate_starts(first, Runtimes())
    later = Snapshot(FOUR, BUILTIN_CLASSES, QuotaConfig(), tuple(r for r in BUSY if r.name != "busy-1"),
                     (*waiting, claim("late", count=3, arrival=102)), now=T0 + 60)
    kept, cold = estimate_starts(later, Runtimes(), memo=memo), estimate_starts(later, Runtimes())
    assert kept == cold
    assert {k[1]: minutes(e.p50, T0) for k, e in kept.items()} == {"two": 11, "one": 1, "late": 41}


def model_is(model: str) -> tuple[str, ...]:
    return (f'device.attributes["gpu.nvidia.com"].productName == "{model}"',)


def test_the_extrapolation_places_claims_where_their_model_frees() -> None:
    """Two H100s end at 10 and 20 minutes, two A100s at 30 and 40. With exact=1 the core starts `any` at 10m on
    the H100 that frees first; the rest are extrapolated node by node: the A100 claim waits for the first
    A100 (30m) though an H100 frees before, and the H100 claim takes the H100 that frees at 20m."""
    mixed = fleet(*node("h", "H100", 2), *node("a", "A100", 2))
    ahead = running(mixed, *(claim(f"busy-{i}", "lab", runtime=f"{m}m", arrival=i, preemptible=False,
                                   selectors=model_is(model))
                             for i, (m, model) in enumerate(((10, "H100"), (20, "H100"), (30, "A100"), (40, "A100")))))
    waiting = (claim("any", runtime="60m"), claim("on-a100", runtime="60m", arrival=101, selectors=model_is("A100")),
               claim("on-h100", runtime="60m", arrival=102, selectors=model_is("H100")))
    snapshot = Snapshot(mixed, BUILTIN_CLASSES, QuotaConfig(), ahead, waiting, now=T0)
    for exact in (1, 300):  # extrapolated, and all through the core: the same here
        estimates = estimate_starts(snapshot, Runtimes(), exact=exact)
        assert {k[1]: minutes(e.p50, T0) for k, e in estimates.items()} == {"any": 10, "on-a100": 30, "on-h100": 20}
        assert estimates[("vision", "on-a100")].blocked_by == ("lab/busy-2",)


def test_an_extrapolated_gang_starts_whole_when_its_last_member_can() -> None:
    """With exact=1 the core starts `first` at 10m; the gang's members, extrapolated one by one, would take the
    GPUs that free at 20m and 30m: the gang starts whole at 30m."""
    waiting = (claim("first", runtime="60m"), claim("a", gang=("g", 2), arrival=101, runtime="60m"),
               claim("b", gang=("g", 2), arrival=102, runtime="60m"))
    snapshot = Snapshot(FOUR, BUILTIN_CLASSES, QuotaConfig(), BUSY, waiting, now=T0)
    extrapolated = estimate_starts(snapshot, Runtimes(), exact=1)
    assert {k[1]: minutes(e.p50, T0) for k, e in extrapolated.items()} == {"first": 10, "a": 30, "b": 30}
    through_the_core = estimate_starts(snapshot, Runtimes())
    assert {k[1]: minutes(e.p50, T0) for k, e in through_the_core.items()} == {"first": 10, "a": 30, "b": 30}
