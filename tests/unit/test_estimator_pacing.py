"""When the allocator's estimator runs: not before a cycle committed, at most every `interval`, and then only
when a committed cycle changed something since its last run and the allocator has no backlog, or once
`refresh` has passed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from services.allocator.estimator import Estimator


def estimator(snapshot: Any, changes: int, last_run: float | None, seen: int, busy: bool = False) -> Estimator:
    cycle = SimpleNamespace(committed_snapshot=snapshot, changes=changes)
    e = Estimator(cast(Any, None), cast(Any, cycle), cast(Any, None), shard="default", interval=5.0, refresh=60.0,
                  busy=lambda: busy)
    e.last_run, e.seen_changes = last_run, seen
    return e


@pytest.mark.parametrize(("snapshot", "changes", "last_run", "seen", "now", "busy", "expected"), [
    (None, 0, None, -1, 100.0, False, False),  # no cycle committed: nothing to estimate
    ("s", 1, None, -1, 100.0, False, True),  # the first
    ("s", 2, 98.0, 1, 100.0, False, False),  # changed, but within the interval
    ("s", 2, 95.0, 1, 100.0, False, True),
    ("s", 2, 95.0, 1, 100.0, True, False),  # the allocator has a backlog: decisions first
    ("s", 2, 40.0, 1, 100.0, True, True),  # ... for a minute at most
    ("s", 1, 95.0, 1, 100.0, False, False),  # nothing changed
    ("s", 1, 40.0, 1, 100.0, False, True),  # nothing changed for a minute: the clock moved on
])
def test_when_it_runs(snapshot: Any, changes: int, last_run: float | None, seen: int, now: float, busy: bool,
                      expected: bool) -> None:
    assert estimator(snapshot, changes, last_run, seen, busy).due_now(now) is expected
