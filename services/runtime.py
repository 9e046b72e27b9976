"""Process settings for the broker's long-running services.

A decision cycle allocates many short-lived objects (trial placements, answers, heap entries). With
CPython's default thresholds the youngest generation is collected every 700 allocations, hundreds of
times per cycle, and the older generations' passes walk every index of the fleet. `make bench-quota`
runs with the same settings as `claimbroker up` and `serve`, so its figures are the service's.
"""

from __future__ import annotations

import gc

YOUNG_GENERATION_THRESHOLD = 20_000  # allocations between collections of the youngest generation


def tune_gc() -> None:
    """Collect the young generation every 20,000 allocations and the older ones 20 times less often."""
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, 20, 20)
