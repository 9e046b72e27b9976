"""The garbage collector's settings for the broker's long-running services.

A decision cycle allocates many short-lived objects (trial placements, answers, heap entries). With
CPython's default thresholds the youngest generation is collected every 700 allocations, hundreds of
times per cycle, and the older generations' passes walk every index of the fleet. `make bench-quota`
runs with the same settings as `claimbroker up` and `serve`, so its figures are the service's.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

YOUNG_GENERATION_THRESHOLD = 20_000  # allocations between collections of the youngest generation
FULL_COLLECTION_INTERVAL_S = 300.0  # at most this long between collections of what cycles kept


def tune_gc() -> None:
    """Collect the young generation every 20,000 allocations and the older ones 20 times less often."""
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, 20, 20)


class CollectorPacing:
    """What a decision cycle keeps (the queue's claims, the fleet's indexes, placement plans) lives on: after
    each cycle it is frozen, so the collector's young and middle passes never walk it again: at a deep
    queue a middle-generation pass over what many cycles kept stalls whichever cycle it falls in
    (`make bench-quota` shows it). Reference counting still frees frozen objects; only reference cycles among
    them wait, for the full collection this runs at most every `full_every_s` seconds."""

    def __init__(self, full_every_s: float = FULL_COLLECTION_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.full_every_s = full_every_s
        self.clock = clock
        self.last_full = clock()

    def after_cycle(self) -> None:
        now = self.clock()
        if now - self.last_full >= self.full_every_s:
            gc.unfreeze()
            gc.collect()
            self.last_full = now
        gc.freeze()
