"""Which start estimates the allocator publishes (the contract: when a claim first waits with one, and again
when it moves by more than a tenth), at most a bounded number per run, the biggest moves first; and the
runtimes observed in the ledger as quantiles."""

from __future__ import annotations

import math

import pytest

from shared.admission.estimate_publishing import MIN_MOVE, REASON_MOVE, due, quantiles, runtimes_from
from shared.admission.estimates import Estimate, Quantiles

NOW = 1_000_000.0
K = ("t", "a")


def est(p50: float | None) -> Estimate:
    return Estimate(p50, p50, ()) if p50 is not None else Estimate(None, None, (), "never")


@pytest.mark.parametrize(("published", "estimate", "expected"), [
    ({}, est(NOW + 600), True),  # first wait with an estimate
    ({}, est(None), True),  # first wait, nothing can be said: the null is published, with its reason
    ({K: NOW + 600}, est(NOW + 600 + 59), False),  # a tenth of 600 s still to wait is 60 s
    ({K: NOW + 600}, est(NOW + 600 + 61), True),
    ({K: NOW + 600}, est(NOW + 600 - 61), True),  # earlier counts as much as later
    ({K: NOW + 600}, est(None), True),  # could be said, now cannot
    ({K: None}, est(None), False),
    ({K: None}, est(NOW + 10), True),
    ({K: NOW - 30}, est(NOW - 30 + MIN_MOVE / 2), False),  # overdue: moves of less than MIN_MOVE are noise
    ({K: NOW - 30}, est(NOW + 5), True),
])
def test_the_rule(published: dict[tuple[str, str], float | None], estimate: Estimate, expected: bool) -> None:
    found = due({K: estimate}, published, NOW, limit=10)
    assert [d.key for d in found] == ([K] if expected else [])


@pytest.mark.parametrize(("reasons", "said", "expected"), [
    ({K: "never"}, "never", False),  # the same null again
    ({K: "never"}, "gang g: 1 of 2 members received", True),  # another reason: said again
    ({}, "gang g: 1 of 2 members received", False),  # its reason not known here (a restart): not said again
])
def test_a_null_is_published_again_when_its_reason_changes(reasons: dict[tuple[str, str], str], said: str,
                                                           expected: bool) -> None:
    found = due({K: Estimate(None, None, (), said)}, {K: None}, NOW, limit=10, reasons=reasons)
    assert [d.key for d in found] == ([K] if expected else [])
    if expected:  # after first publications and big moves
        assert found[0].move == REASON_MOVE < math.inf


def test_bounded_count_biggest_moves_first() -> None:
    estimates = {("t", f"c{i}"): est(NOW + 1000 + 100 * i) for i in range(6)}
    published: dict[tuple[str, str], float | None] = {("t", f"c{i}"): NOW + 1000 for i in range(1, 6)}
    # c0 has none published (first: before every move); c1..c5 moved by 100..500 s of 1000 still to wait
    found = due(estimates, published, NOW, limit=3)
    assert [d.key[1] for d in found] == ["c0", "c5", "c4"]
    assert found[0].move == math.inf
    assert found[1].move == pytest.approx(0.5)
    assert len(due(estimates, published, NOW, limit=100)) == 5  # c1 moved exactly a tenth: not more


def test_runtimes_from_observed_runs() -> None:
    runs = [("a", "h100", float(s)) for s in (10, 20, 30, 40, 50, 60, 70, 80, 90, 100)]
    runs += [("a", None, 1000.0), ("b", "h100", 5.0), ("b", "h100", 6.0)]
    runtimes = runtimes_from(runs)
    assert runtimes.by_flavor == {("a", "h100"): Quantiles(50.0, 90.0)}  # b's two runs are too few
    assert runtimes.by_tenant == {"a": quantiles([*range(10, 101, 10), 1000])}
    assert runtimes.default == quantiles([*range(10, 101, 10), 1000, 5, 6])
    assert runtimes.of("a", ["h100"], None) == Quantiles(50.0, 90.0)
    assert runtimes.of("b", ["h100"], None) == runtimes.default
    assert runtimes.of("b", ["h100"], 7.0) == Quantiles(7.0, 7.0)  # the annotation first
    assert runtimes_from([]).default is None


def test_error_summary_per_tenant_and_flavor() -> None:
    from shared.admission.estimate_publishing import error_summary

    overall, groups = error_summary([("a", "h100", 60.0, -10.0), ("a", "h100", None, 30.0), ("b", None, -600.0, 5.0)])
    assert overall is not None and (overall.claims, overall.first_p50, overall.last_p50, overall.last_p90) == (
        3, 60.0, 10.0, 30.0)
    assert [(g.tenant, g.flavor, g.claims, g.first_p50, g.first_p90, g.last_p50, g.last_p90) for g in groups] == [
        ("a", "h100", 2, 60.0, 60.0, 10.0, 30.0), ("b", None, 1, 600.0, 600.0, 5.0, 5.0)]
    assert error_summary([]) == (None, [])
