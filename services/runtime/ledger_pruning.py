"""What the ledger keeps only for a while (the inbox's message ids, remembered releases of unknown claims),
forgotten in small batches between a service's transactions: a transaction of its own, at most
`batch` rows each, never inside a decision transaction, so the decisions do not wait on it. A pass runs
every `interval` seconds, and again soon after while a batch came back full, so a backlog (an upgrade
from a ledger that never pruned) drains at thousands of rows a second without long transactions."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.ledger.errors import LEDGER_ERRORS
from shared.ledger.handles import AsyncSession

Prune = Callable[[AsyncSession, datetime, int], Awaitable[int]]  # (session, before, at most) -> rows gone

log = logging.getLogger("claimbroker.retention")


@dataclass
class Pruner:
    """Calls each of `prunes` with the time before which rows go (`clock`, the time the service writes its
    rows with, less `retention`); passes are paced in real time."""

    sessions: Callable[[], Any]  # the service's async_sessionmaker
    prunes: Sequence[Prune]
    retention: float
    clock: Callable[[], float]
    interval: float = 10.0
    batch: int = 1000
    behind_pause: float = 0.2  # while a batch came back full: the next pass after the next message batch
    passes: int = 0  # completed passes; tests wait on it
    pruned: int = 0  # rows forgotten so far
    _due: float = field(default=-math.inf)

    async def run_if_due(self) -> None:
        started = time.monotonic()
        if started < self._due:
            return
        before = datetime.fromtimestamp(self.clock() - self.retention, UTC)
        full = False
        try:
            for prune in self.prunes:
                async with self.sessions() as session, session.begin():
                    gone = await prune(session, before, self.batch)
                self.pruned += gone
                full = full or gone >= self.batch
        except LEDGER_ERRORS as error:  # the ledger away: what is kept waits for the next pass
            log.warning("pruning the ledger failed (%s: %s); trying again in %.0fs", type(error).__name__, error,
                        self.interval)
        else:
            self.passes += 1
        self._due = started + (self.behind_pause if full else self.interval)
