"""The intake of claim messages: each fetched batch goes to the decision transaction through the consumer
shell (services/bus/consumer.Deliveries), which acks it once committed and otherwise does what the error's
kind says. What is the allocator's own is here: a batch held while the ledger is away, a message that
fails alone while the cycle without it commits set aside in the dead letters with an alert, and the
service-degraded alert while decision cycles fail."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from nats.aio.msg import Msg

from services.allocator.cycle import alert
from services.allocator.messages import CONSUMER, message_key, printable
from services.allocator.outbox_relay import OutboxRelay
from services.allocator.transaction import DecisionTransaction
from services.bus.consumer import Deliveries
from services.runtime.outage import Outage
from shared.ledger import inbox
from shared.ledger.errors import LEDGER_ERRORS
from shared.ledger.handles import AsyncSession
from shared.ledger.unit_of_work import unit_of_work

log = logging.getLogger("claimbroker.allocator")
Report = Callable[[str, bool], Awaitable[None]]  # (why, resolved): the allocator's service-degraded alert


class ClaimIntake:
    """The consumer shell's handler for the claims stream (services/bus/consumer.Handler). `report` raises and
    resolves the allocator's service-degraded alert; `cycle_due` is called after every failed try (a
    cycle runs again soon)."""

    def __init__(self, transaction: DecisionTransaction, relay: OutboxRelay, sessions: Callable[[], AsyncSession],
                 *, max_deliver: int, ledger_outage: Outage, stopping: Callable[[], bool],
                 report: Report, cycle_due: Callable[[], None], clock: Callable[[], float]) -> None:
        self.transaction = transaction
        self.relay = relay
        self.sessions = sessions
        self.report = report
        self.cycle_due = cycle_due
        self.clock = clock
        self._failure_logged = -float("inf")  # when a failing cycle was last logged with its trace
        self.deliveries = Deliveries(
            self, log=log, max_deliver=max_deliver, holding=ledger_outage, stopping=stopping, dead_letters=True,
            retry_delay=lambda deliveries: 0.2 * deliveries,
            failing_delay=lambda deliveries: min(5.0, 0.5 * max(deliveries, 1)))

    @property
    def failing(self) -> bool:
        """Decision cycles fail, or the ledger does not answer (readiness)."""
        return self.deliveries.failing

    async def take(self, messages: Sequence[Msg]) -> None:
        """Decide the batch (none: a cycle without messages) and settle each message."""
        await self.deliveries.deliver(messages)

    async def handle(self, messages: Sequence[Msg]) -> None:
        await self.transaction.decide(messages)

    async def after_failure(self, error: Exception) -> None:
        self.cycle_due()

    async def dead_letter(self, message: Msg, error: Exception) -> bool:
        """Keep the message and its error, mark it handled and alert, in one transaction; False when even
        that cannot be written (the database is down: the message is redelivered instead)."""
        key = message_key(message)
        message_id = key.message_id
        reason = f"{type(error).__name__}: {printable(str(error), 2000)}"
        log.error("dead-lettered message %s on %s: %s", message_id, printable(message.subject, 300), reason)
        subject = printable(message.subject, 1000)
        try:
            async with unit_of_work(self.sessions) as work:
                if await inbox.set_aside(work.session, CONSUMER, key, subject=subject, data=message.data,
                                         error=reason, deliveries=message.metadata.num_delivered or 1,
                                         at=datetime.fromtimestamp(self.clock(), UTC)):
                    work.writes.event(*alert(
                        "message-dead-lettered", message_id, f"alert:dead:{message_id}",
                        f"a message on {subject[:200]} could not be committed and was set aside: {reason[:300]}",
                        {"messageId": message_id, "subject": subject, "error": reason}))
        except LEDGER_ERRORS as write_error:  # the ledger refuses or is away: the message is redelivered
            log.error("could not dead-letter message %s: %s", message_id, write_error)
            return False
        self.relay.committed(work.flushed)
        return True

    async def degraded(self, error: Exception, *, unavailable: bool) -> None:
        what = "the ledger does not answer" if unavailable else "decision cycles fail"
        await self.report(f"{what}: {type(error).__name__}: {printable(str(error), 300)}", False)

    async def unhandled(self, error: Exception, message: Msg | None) -> None:
        now = time.monotonic()
        if now >= self._failure_logged + 60:  # a cycle retried every second: its trace once a minute
            self._failure_logged = now
            log.error("decision cycle failed: %s: %s", type(error).__name__, printable(str(error), 500),
                      exc_info=error)
        else:
            log.warning("decision cycle failed again: %s", type(error).__name__)

    async def recovered(self) -> None:
        await self.report("decision cycles commit again", True)

    async def settled(self, messages: Sequence[Msg]) -> None:
        pass  # what the commit wrote was handed to the relay as it committed
