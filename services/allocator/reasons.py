"""Keeping waiting claims' reasons current at a bounded cost: the decision core answers only claims without
an answer (and changes of state), so a Pending claim answered longer than `refresh` ago is asked again."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace

from shared.ledger.queue import Queue


class ReasonRefresh:
    """When each Pending claim was last answered, oldest first: only the stale ones are looked at each
    cycle, not every waiting claim."""

    def __init__(self, refresh: float, clock: Callable[[], float]) -> None:
        self.refresh = refresh
        self.clock = clock
        self.answered_at: dict[tuple[str, str], float] = {}  # oldest first
        self.matched_at = -math.inf  # when answered_at was last matched against every waiting claim

    def answered(self, key: tuple[str, str], at: float) -> None:
        """The claim was answered Pending at `at`."""
        self.answered_at.pop(key, None)  # to the end: answers stay oldest first
        self.answered_at[key] = at

    def clear(self) -> None:
        """No claim waits."""
        self.answered_at.clear()

    def ask_again(self, queue: Queue) -> None:
        """Queue the claims answered longer than `refresh` ago unanswered (a change the next cycle is handed);
        a stale one no longer waiting is forgotten then. Once a refresh period the answer times are matched
        against every waiting claim (claims this allocator did not answer, after a restart or by another
        allocator, count as answered now): a walk over every waiting claim, too much for every cycle."""
        now = self.clock()
        answered_at, waiting = self.answered_at, queue.waiting
        if now >= self.matched_at + self.refresh:
            self.matched_at = now
            for key in answered_at.keys() - waiting.keys():  # no longer waiting: forgotten
                del answered_at[key]
            for key in waiting.keys() - answered_at.keys():  # unknown: as of now
                answered_at[key] = now
        stale = list(itertools.takewhile(lambda item: now - item[1] >= self.refresh, answered_at.items()))
        for key, _ in stale:  # oldest first
            claim = waiting.get(key)
            if claim is None:
                del answered_at[key]
            elif claim.answered:
                waiting.put(replace(claim, answered=False))
