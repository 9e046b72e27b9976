"""A dependency's outage as a long-running service sees it: the service waits and tries again instead of
exiting, logs when the outage starts and when it ends (not every failed try), and waits longer between
tries, up to a cap."""

from __future__ import annotations

import asyncio
import logging
import time


class Outage:
    def __init__(self, what: str, log: logging.Logger, *, first_wait: float = 0.2, most_wait: float = 5.0) -> None:
        self.what = what
        self.log = log
        self.first_wait = first_wait
        self.most_wait = most_wait
        self.wait = first_wait
        self.since: float | None = None  # when the current outage began; None while all is well

    async def failed(self, error: BaseException) -> None:
        """A try failed: note it (logged once an outage) and wait before the next."""
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning("%s unreachable (%s: %s); retrying until it is back", self.what,
                             type(error).__name__, error)
        await asyncio.sleep(self.wait)
        self.wait = min(self.most_wait, self.wait * 2)

    def ok(self) -> float | None:
        """A try succeeded: the outage, if any, is over; returns how long it lasted (None: there was none)."""
        self.wait = self.first_wait
        if self.since is None:
            return None
        lasted = time.monotonic() - self.since
        self.log.info("%s reachable again after %.1fs", self.what, lasted)
        self.since = None
        return lasted
