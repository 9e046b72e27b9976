"""The outbox relay: what each commit wrote to the outbox goes to NATS, in commit order, beside the
decisions (the next batch is decided while NATS acknowledges the last one's statuses: awaited in line,
publishing took a third of each batch's time under a burst). While NATS or the ledger is away the events
wait in the outbox, and the relay tries again with backoff."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.js import JetStreamContext

from services.allocator.decision_metrics import Parts, batch_log
from services.allocator.messages import printable
from services.bus.publish import publish_pipelined
from services.runtime import metrics
from services.runtime.outage import Outage
from shared.ledger import outbox
from shared.ledger.handles import AsyncSession
from shared.ledger.unit_of_work import unit_of_work

log = logging.getLogger("claimbroker.allocator")


class OutboxRelay:
    """`due()` after a commit wrote events; `run()` is the task that publishes them. `answers_expire`: the
    status stream takes per-message TTLs (nats-server 2.11 and later), so answers to releases of unknown
    claims go with theirs; without, they go without one (the stream would refuse them)."""

    def __init__(self, sessions: Callable[[], AsyncSession]) -> None:
        self.sessions = sessions
        self.js: JetStreamContext | None = None  # bound when the allocator runs
        self.answers_expire = False
        self.behind = False  # committed events wait in the outbox: published as soon as NATS takes them
        self._due = asyncio.Event()
        self._lock = asyncio.Lock()

    def due(self) -> None:
        self._due.set()

    async def run(self) -> None:
        """One task, so the outbox goes out in commit order."""
        outage = Outage("publishing the outbox", log)
        while True:
            await self._due.wait()
            self._due.clear()
            await self.publish_when_possible()
            if self.behind:
                await outage.failed(RuntimeError("the outbox could not be published"))
                self._due.set()
            else:
                outage.ok()

    async def publish(self) -> None:
        """Publish committed events in order; Nats-Msg-Id makes a re-publish after a crash harmless."""
        assert self.js is not None, "the relay publishes once the allocator runs"
        async with self._lock:
            while True:
                # Read, publish, then mark in a second short transaction: no ledger lock is held while
                # we wait on NATS (SQLite has one writer), and a crash in between only re-publishes
                # events that JetStream then drops as duplicates.
                parts = Parts()
                async with unit_of_work(self.sessions) as work:
                    events = await outbox.unpublished(work)
                parts.lap("read")
                metrics.OUTBOX_UNPUBLISHED.set(len(events))
                if not events:
                    return
                await publish_pipelined(self.js, [(e.subject, e.payload, e.message_id) for e in events],
                                        ttls=[e.ttl_s if self.answers_expire else None for e in events])
                parts.lap("publish")
                async with unit_of_work(self.sessions) as work:
                    await outbox.mark_published(work, [e.id for e in events])
                parts.lap("mark")
                batch_log.info("outbox batch", extra={"events": len(events), "parts_ms": parts.rounded()})

    async def publish_when_possible(self) -> None:
        """Publish what committed; while NATS or the ledger is down the events wait in the outbox for the
        next try (nothing is lost, and the allocator goes on)."""
        try:
            await self.publish()
        except Exception as error:  # the relay loop's guard: NATS or the ledger away, tried again
            if not self.behind:
                log.warning("outbox not published yet (%s: %s); trying again until it is", type(error).__name__,
                            printable(str(error), 200))
            self.behind = True
        else:
            self.behind = False
