"""A dependency's outage as a long-running service sees it: the service waits and tries again instead of
exiting, logs when the outage starts and when it ends (not every failed try), and waits longer between
tries, up to a cap."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from services.bus.connection import BUS_ERRORS
from services.bus.publish import publish_json
from shared.contract import events, subjects

T = TypeVar("T")


class Outage:
    def __init__(self, what: str, log: logging.Logger, *, first_wait: float = 0.2, most_wait: float = 5.0) -> None:
        self.what = what
        self.log = log
        self.first_wait = first_wait
        self.most_wait = most_wait
        self.wait = first_wait
        self.since: float | None = None  # when the current outage began; None while all is well
        self.error = ""  # the last failure, for readiness

    async def failed(self, error: BaseException) -> None:
        """A try failed: note it (logged once an outage) and wait before the next."""
        self.error = f"{type(error).__name__}: {error}"[:300]
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning("%s unreachable (%s: %s); retrying until it is back", self.what,
                             type(error).__name__, error)
        await asyncio.sleep(self.wait)
        self.wait = min(self.most_wait, self.wait * 2)

    def why(self) -> str | None:
        """For /readyz: how long this outage has lasted and its last error, or None while all is well."""
        if self.since is None:
            return None
        return f"{self.what} unreachable for {time.monotonic() - self.since:.0f}s ({self.error})"

    def ok(self) -> float | None:
        """A try succeeded: the outage, if any, is over; returns how long it lasted (None: there was none)."""
        self.wait = self.first_wait
        if self.since is None:
            return None
        lasted = time.monotonic() - self.since
        self.log.info("%s reachable again after %.1fs", self.what, lasted)
        self.since = None
        return lasted


async def until_done(step: Callable[[], Awaitable[T]], outage: Outage,
                     fatal: tuple[type[Exception], ...] = ()) -> T:
    """A service's start-up step (create the streams, read the ledger, subscribe) tried until it works: a
    service started while NATS or the database is down waits for them instead of exiting. `fatal` errors
    (bad settings, an invalid file) are raised at once: no wait mends them."""
    while True:
        try:
            result = await step()
        except fatal:
            raise
        except Exception as error:  # a start-up step's guard: whatever its dependency raises while it is away
            await outage.failed(error)
        else:
            outage.ok()
            return result


async def publish_degraded(js: Any, service: str, why: str, log: logging.Logger, *, resolved: bool = False) -> None:
    """A service's `service-degraded` alert (critical), straight to NATS: the ledger may be what fails, so
    it cannot go through an outbox. Raised when what the service needs starts failing, resolved when it
    works again; after a NATS outage it can only be published once NATS is back. Best effort: a publish
    that fails is logged."""
    now = time.time()
    payload = events.alert(kind="service-degraded", severity="critical", key=f"service-degraded:{service}",
                           summary=f"{service}: {why}", details={"why": why}, labels={"service": service},
                           first_seen=now, last_seen=now, resolved=resolved)
    try:
        await publish_json(js, subjects.alert("critical", "service-degraded"), payload)
    except BUS_ERRORS as error:
        log.error("could not publish the service-degraded alert (%s): %s", why, error)
