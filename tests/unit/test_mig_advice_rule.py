"""mig-relayout-suggested: raised once a plan has admitted enough for the window, resolved when none does."""

from __future__ import annotations

from shared.alerts.book import Raise, Resolve
from shared.alerts.rules import MIG_RELAYOUT, MigAdviceRule

LAYOUT = [{"node": "m", "gpu": 1, "model": "H100", "now": "whole", "planned": "all-1g.10gb"}]


def test_a_plan_that_lasts_the_window_is_advice_and_one_that_ends_resolves_it() -> None:
    rule = MigAdviceRule(minimum=2, window=60)
    assert rule.on_plan(3, LAYOUT, now=0) == []  # not yet for the window
    assert rule.on_plan(3, LAYOUT, now=30) == []
    raised = rule.on_plan(3, LAYOUT, now=61)
    assert len(raised) == 1 and isinstance(raised[0], Raise) and raised[0].alert.kind == MIG_RELAYOUT
    assert "would admit 3 waiting claim(s): m GPU 1 to all-1g.10gb" in raised[0].alert.summary
    gone = rule.on_plan(1, LAYOUT, now=90)  # below the minimum
    assert len(gone) == 1 and isinstance(gone[0], Resolve)
    assert rule.on_plan(5, LAYOUT, now=100) == []  # the window starts again


def test_no_layout_no_advice() -> None:
    rule = MigAdviceRule(minimum=1, window=0)
    assert all(isinstance(a, Resolve) for a in rule.on_plan(4, [], now=0))
    assert isinstance(rule.on_plan(1, LAYOUT, now=1)[0], Raise)
