"""The decision transaction: a batch of claim messages and one decision cycle in one unit of work.

Exactly-once effects: each message id goes into the inbox in the same transaction as the cycle's
decisions and their outbox events; a redelivery (the process died between commit and ack) finds its
id and changes nothing. Every transaction first takes the shard's turn (its lease row locked: SELECT ...
FOR UPDATE on PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers) and reads the queue and the
quotas from the ledger, so two allocators on one database take turns and each decides on what the other
wrote: neither can exceed a quota, and device_allocations' primary key refuses a device twice. Quota
changes from the admin API are read at the next cycle."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from nats.aio.msg import Msg

from services.allocator.claim_batch import DEFAULT_EARLY_RELEASES_PER_TENANT, RELEASE_ANSWER_TTL_S, apply_messages
from services.allocator.cycle import Cycled, DecisionCycle
from services.allocator.decision_metrics import DecisionMetrics, Parts
from services.allocator.messages import CONSUMER, message_key, read_message
from services.allocator.outbox_relay import OutboxRelay
from shared.ledger import inbox, outbox
from shared.ledger.handles import AsyncSession
from shared.ledger.unit_of_work import unit_of_work


class DecisionTransaction:
    """`decide` is the allocator's handling of a batch; `decided`: what the last committed transaction
    decided (statuses by state, preemptions as `preempted:<rule>`). The lease it takes expires a while
    after the next cycle is due (`cycle_interval`)."""

    def __init__(self, sessions: Callable[[], AsyncSession], cycle: DecisionCycle, metrics: DecisionMetrics, *,
                 shard: str, holder: str, cycle_interval: float, clock: Callable[[], float],
                 early_releases_per_tenant: int = DEFAULT_EARLY_RELEASES_PER_TENANT,
                 release_answer_ttl: float = RELEASE_ANSWER_TTL_S, relay: OutboxRelay | None = None) -> None:
        self.sessions = sessions
        self.cycle = cycle
        self.metrics = metrics
        self.shard, self.holder = shard, holder
        self.cycle_interval = cycle_interval
        self.clock = clock
        # Releases of unknown claims are remembered as long as message ids, at most this many per tenant;
        # their answers expire after `release_answer_ttl` where the status stream allows it.
        self.early_releases_per_tenant = early_releases_per_tenant
        self.release_answer_ttl = release_answer_ttl
        self.decided: collections.Counter[str] = collections.Counter()
        # what each commit wrote to the outbox is handed to it; it marks what the relay published since
        self.relay = relay

    async def decide(self, messages: Sequence[Msg]) -> None:
        """One transaction: the batch's inbox rows and claim changes, one decision cycle, its events."""
        started = time.perf_counter()
        parts = Parts()
        marks = self.relay.take_marks() if self.relay is not None and self.relay.marks_due() else []
        try:
            async with unit_of_work(self.sessions) as work:
                await work.take_turn(self.shard, self.holder, self.clock() + 3 * self.cycle_interval + 30)
                if marks:  # the events the relay published from memory since it last marked
                    await outbox.mark_published_by_message_id(work, marks)
                parts.lap("turn")
                keys = [message_key(message) for message in messages]
                now = datetime.fromtimestamp(self.clock(), UTC)
                # the ids not seen before, recorded now (one statement on PostgreSQL): the others are
                # redeliveries, re-sent messages, or duplicates in this batch
                unseen = await inbox.record_unseen(work.session, CONSUMER, keys, now)
                parts.lap("inbox")
                fresh = []
                for message, key in zip(messages, keys, strict=True):
                    if key not in unseen:
                        continue
                    unseen.discard(key)  # a duplicate later in this batch is not read again
                    fresh.append(read_message(message.subject, message.data, key.message_id,
                                              message.metadata.sequence.stream))
                parts.lap("parse")
                # the quotas, read once: submissions are checked against maxPending, the cycle decides on them
                config = await self.cycle.quotas.load(work.session) if any(m.claim is not None for m in fresh) \
                    else None
                parts.lap("quotas")
                if await apply_messages(work, fresh, config, now=now,
                                        early_releases_per_tenant=self.early_releases_per_tenant,
                                        answer_ttl=self.release_answer_ttl):
                    self.cycle.waiting = True  # claims to place, or devices freed that may let waiting claims in
                parts.lap("intake")
                cycled: Cycled = await self.cycle.run(work, config, parts)
                await work.flush()
                parts.lap("flush")
            parts.lap("commit")
        except BaseException:
            self.cycle.queue_cache.invalidate()  # it read rows this transaction wrote, which are gone with it
            self.cycle.gang_clocks.rolled_back()
            self.cycle.rolled_back()  # past use stepped in it
            if self.relay is not None:
                self.relay.return_marks(marks)
            raise
        if self.relay is not None:  # at once, before anything else commits: the relay keeps commit order
            self.relay.committed(work.flushed)
        self.cycle.gang_clocks.committed()
        self.cycle.inventory.lost_nodes -= cycled.lost  # only once committed: a rollback handles them again
        self.decided = collections.Counter({f"preempted:{rule}": n for rule, n in cycled.preempted.items()})
        self.decided.update(work.writes.states)
        self.cycle.committed(bool(self.decided))
        self.metrics.record(len(messages), time.perf_counter() - started, self.decided, parts)
