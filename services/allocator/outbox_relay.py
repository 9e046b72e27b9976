"""The outbox relay: what each commit wrote to the outbox goes to NATS, in commit order, beside the
decisions (the next batch is decided while NATS acknowledges the last one's statuses: awaited in line,
publishing took a third of each batch's time under a burst). While NATS or the ledger is away the events
wait in the outbox, and the relay tries again with backoff.

Two ways in (issue 42). At start, and after any failure to publish, the relay reads the outbox back in
order, publishes and marks what it read, until nothing is left (the ledger's way). Then each commit hands
its events over (`committed`, called right after the commit, so they queue in commit order) and the relay
publishes them from memory: no transaction to read them back, and none of its own to mark them, since a
decision transaction marks them (`marks_due`, then `take_marks`: at most once every MARK_EVERY_S, or once
MARK_BATCH wait, so most transactions have no marking statement), or the relay itself once it has been idle
a second.
Marks follow publishing order, so what a crash leaves unmarked is the last events published, which a
restart publishes again in the same order (JetStream drops them as duplicates within its window; past it,
the last status of each claim is still its last): at most about MARK_EVERY_S of them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

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
MARK_AFTER_IDLE_S = 1.0  # published from memory and not marked by a decision transaction: the relay marks them
MARK_EVERY_S = 1.0  # a decision transaction marks what was published from memory at most this often...
MARK_BATCH = 500  # ...unless this many wait


class OutboxRelay:
    """`committed(events)` right after a commit (or `due()`, for events it did not hand over); `run()` is
    the task that publishes them. `answers_expire`: the status stream takes per-message TTLs (nats-server
    2.11 and later), so answers to releases of unknown claims go with theirs; without, they go without one
    (the stream would refuse them)."""

    def __init__(self, sessions: Callable[[], AsyncSession]) -> None:
        self.sessions = sessions
        self.js: JetStreamContext | None = None  # bound when the allocator runs
        self.answers_expire = False
        self.behind = False  # committed events wait in the outbox: published as soon as NATS takes them
        self._due = asyncio.Event()
        self._lock = asyncio.Lock()
        self._memory: list[outbox.Unpublished] | None = None  # handed over, to publish; None: read the ledger
        self._committed_since_read = False  # events committed while the ledger was being read
        self._marks: list[str] = []  # message ids published from memory, not yet marked
        self._marks_taken_at = time.monotonic()

    def due(self) -> None:
        """Events were committed that only the ledger has: read it back."""
        self._memory = None
        self._committed_since_read = True
        self._due.set()

    def committed(self, rows: list[dict[str, Any]]) -> None:
        """A unit of work committed these outbox rows (UnitOfWork.flushed): called right after its commit,
        before anything else can commit, so they queue in commit order."""
        if not rows:
            return
        if self._memory is None:
            self._committed_since_read = True
        else:
            self._memory.extend(outbox.handed_over(rows))
        self._due.set()

    def marks_due(self) -> bool:
        """Whether a decision transaction should mark now: MARK_EVERY_S since the last marks were taken, or
        MARK_BATCH waiting (marking is one statement; every transaction had one)."""
        return bool(self._marks) and (len(self._marks) >= MARK_BATCH
                                      or time.monotonic() >= self._marks_taken_at + MARK_EVERY_S)

    def take_marks(self) -> list[str]:
        """The events published from memory and not yet marked, for the caller's transaction to mark
        (`outbox.mark_published_by_message_id`); `return_marks` if it does not commit."""
        marks, self._marks = self._marks, []
        self._marks_taken_at = time.monotonic()
        return marks

    def return_marks(self, marks: list[str]) -> None:
        self._marks[:0] = marks

    async def run(self) -> None:
        """One task, so the outbox goes out in commit order."""
        outage = Outage("publishing the outbox", log)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._due.wait(), MARK_AFTER_IDLE_S if self._marks else None)
            if not self._due.is_set():  # idle a while with events published and not marked: mark them
                await self.mark_when_possible()
                continue
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
                if self._memory is None:
                    if not await self._publish_from_ledger():
                        return
                    continue
                if not self._memory:
                    metrics.OUTBOX_UNPUBLISHED.set(0)
                    return
                events, self._memory = self._memory, []
                parts = Parts()
                try:
                    await self._send(events)
                except BaseException:
                    self._memory = None  # the ledger has them all, unmarked: read it back
                    self._committed_since_read = True
                    raise
                parts.lap("publish")
                self._marks.extend(e.message_id for e in events)
                batch_log.info("outbox batch", extra={"events": len(events), "parts_ms": parts.rounded(),
                                                      "from": "memory"})

    async def _publish_from_ledger(self) -> bool:
        """One batch read back, published and marked; False once the ledger has none left and nothing was
        committed meanwhile (the relay then takes events from memory)."""
        # Read, publish, then mark in a second short transaction: no ledger lock is held while we wait on
        # NATS (SQLite has one writer), and a crash in between only re-publishes events that JetStream then
        # drops as duplicates.
        parts = Parts()
        self._committed_since_read = False
        marks = self.take_marks()
        try:
            async with unit_of_work(self.sessions) as work:
                if marks:  # published from memory before a failure: not read back again
                    await outbox.mark_published_by_message_id(work, marks)
                events = await outbox.unpublished(work)
        except BaseException:
            self.return_marks(marks)
            raise
        parts.lap("read")
        metrics.OUTBOX_UNPUBLISHED.set(len(events))
        if not events:
            if not self._committed_since_read:
                self._memory = []  # caught up: commits from now on are handed over
            return not self._committed_since_read
        await self._send(events)
        parts.lap("publish")
        async with unit_of_work(self.sessions) as work:
            await outbox.mark_published(work, [e.id for e in events])
        parts.lap("mark")
        batch_log.info("outbox batch", extra={"events": len(events), "parts_ms": parts.rounded(), "from": "ledger"})
        return True

    async def _send(self, events: list[outbox.Unpublished]) -> None:
        assert self.js is not None
        await publish_pipelined(self.js, [(e.subject, e.payload, e.message_id) for e in events],
                                ttls=[e.ttl_s if self.answers_expire else None for e in events])

    async def mark_when_possible(self) -> None:
        """Mark what was published from memory, in a transaction of the relay's own (nothing else came to
        mark it); tried again later when the ledger is away."""
        marks = self.take_marks()
        if not marks:
            return
        try:
            async with unit_of_work(self.sessions) as work:
                await outbox.mark_published_by_message_id(work, marks)
        except Exception as error:  # the ledger away: marked by a later transaction
            self.return_marks(marks)
            log.warning("published events not marked yet (%s); trying again", type(error).__name__)

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
