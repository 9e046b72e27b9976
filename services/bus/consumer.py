"""The one shell around a durable JetStream pull consumer, for every service that consumes a stream (the
allocator's claims, the notifier's statuses). What each service does with a batch is its own; how the
batch is fetched, how an outage of NATS is waited out and how fetched messages stay in hand is here.

- The consumer is created, or an existing one brought to the service's settings (`pull_subscribe` alone
  keeps an existing consumer's: a 30 s ack_wait outlived an upgrade).
- `fetch` returns the next batch, or nothing when none came in time or NATS is away: an outage is logged
  once when it starts and once when it ends, waited out with a growing pause, and never ends the service.
- `in_hand` tells JetStream every third of ack_wait that a batch being handled is still in progress, so a
  short ack_wait (what makes a killed replica's batch come back in seconds) does not redeliver a slow
  transaction's messages to another replica meanwhile.
- `Deliveries` owns what becomes of a fetched batch: acked once its handler committed it; otherwise what
  the handler's error says (kopf's habit): `TemporaryError` (a fault that passes) is redelivered after a
  delay, `Unavailable` (the ledger away) is held in hand and tried again, `PermanentError` (the message
  itself) is dead-lettered; a fault of unknown kind is redelivered once, then blamed. The handler writes
  its effects and the inbox (shared.ledger.inbox) in one transaction, so a redelivery changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig

from services.bus.cancel import raise_lost_cancel
from services.bus.connection import BUS_ERRORS
from services.runtime import metrics
from services.runtime.outage import Outage, until_done
from shared.ledger import errors as ledger_errors


class PullConsumer:
    def __init__(self, nc: Client, *, stream: str, durable: str, subject: str,
                 filter_subjects: Sequence[str], ack_wait: float, max_deliver: int, batch: int, log: logging.Logger,
                 outage: Outage | None = None,
                 on_recovered: Callable[[float], Awaitable[None]] | None = None) -> None:
        self.nc, self.js = nc, nc.jetstream()
        self.stream, self.durable, self.subject, self.batch = stream, durable, subject, batch
        self.config = ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait,
                                     max_deliver=max_deliver, filter_subjects=list(filter_subjects))
        self.log = log
        self.outage = outage or Outage("NATS", log)  # the service's own, when its readiness reports it
        self.on_recovered = on_recovered  # called with how long an outage lasted, once NATS answers again
        self._subscription: Any = None

    async def open(self) -> None:
        """Create or update the durable consumer and subscribe to it, waiting for NATS if it is away."""
        self._subscription = await until_done(self._subscribe, self.outage)

    async def _subscribe(self) -> Any:
        try:
            await self.js.add_consumer(self.stream, self.config)
        except BUS_ERRORS as error:  # an existing consumer it cannot change still serves
            self.log.warning("could not bring the %s consumer to this service's settings: %s", self.durable, error)
        return await self.js.pull_subscribe(self.subject, durable=self.durable, stream=self.stream, config=self.config)

    async def fetch(self, timeout: float) -> list[Msg]:
        """Up to `batch` messages; none when none came within `timeout` or NATS is away (then after a pause
        that grows with the outage)."""
        try:
            messages = list(await self._subscription.fetch(self.batch, timeout=timeout))
        except (NatsTimeout, TimeoutError):  # nats-py raises either when nothing arrived in time
            messages = []
        except Exception as error:  # the consumer loop's guard: NATS restarting or gone, whatever nats-py raises
            await self.outage.failed(error)
            return []
        if not self.nc.is_connected:  # while nats-py reconnects, a fetch only times out
            await self.outage.failed(ConnectionError("not connected to NATS; reconnecting"))
            return []
        if (lasted := self.outage.ok()) is not None and self.on_recovered is not None:
            await self.on_recovered(lasted)
        metrics.CONSUMER_PENDING.labels(self.durable).set(messages[-1].metadata.num_pending if messages else 0)
        raise_lost_cancel()  # a cancel that nats-py swallowed: fetched, unacked messages come back after ack_wait
        return messages

    @contextlib.asynccontextmanager
    async def in_hand(self, messages: Sequence[Msg]) -> AsyncIterator[None]:
        """While the block handles `messages`, mark them in progress every third of ack_wait."""
        if not messages:
            yield
            return

        async def keep() -> None:
            while True:
                await asyncio.sleep(self.config.ack_wait / 3)  # type: ignore[operator]
                for message in messages:
                    with contextlib.suppress(*BUS_ERRORS):  # acked meanwhile, or the connection is down
                        await message.in_progress()

        keeper = asyncio.create_task(keep())
        try:
            yield
        finally:
            keeper.cancel()

    @staticmethod
    async def ack_all(messages: Sequence[Msg]) -> None:
        """Acks sent without waiting for each to be confirmed: their effects are committed, so a lost ack is
        a redelivery that the inbox makes harmless. Raises if the connection fails meanwhile."""
        for message in messages:
            await message.ack()

    @staticmethod
    async def nak(message: Msg, delay: float | None) -> None:
        """Ask for a redelivery (after `delay`); with NATS down it comes anyway, after ack_wait."""
        with contextlib.suppress(*BUS_ERRORS):
            await message.nak(delay=delay)


class TemporaryError(Exception):
    """Handling failed for a reason that passes, not for what the messages hold: a message that fails alone
    is redelivered after `delay` (None: the consumer's delay for its delivery count) until its last
    delivery but one, and dead-lettered only then. A write the ledger refused is one."""

    def __init__(self, message: str = "", *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class Unavailable(TemporaryError):
    """What the handler needs is away (the ledger does not answer): no message is at fault, so the batch is
    not split. A consumer that holds its batches waits the outage out with the batch in hand, spending none
    of its deliveries; one that does not naks the batch after `delay`."""


class PermanentError(Exception):
    """The message can never be handled as it is: once it fails alone, and the handler succeeds without it,
    it is dead-lettered without a redelivery."""


def kind_of(error: BaseException) -> type[Exception] | None:
    """The typed error `error` counts as: a handler's own as raised, a ledger fault as its kind
    (shared/ledger/errors.py knows which database errors pass); None: a fault of unknown kind."""
    for kind in (Unavailable, TemporaryError, PermanentError):  # the narrowest first
        if isinstance(error, kind):
            return kind
    if ledger_errors.unavailable(error):
        return Unavailable
    if ledger_errors.refused(error):
        return TemporaryError
    return None


class Handler(Protocol):
    """What a consumer gives its `Deliveries`: the handling of a batch, and what it does when that fails."""

    async def handle(self, messages: Sequence[Msg]) -> None:
        """Handle the messages in one transaction (none: its work without messages); raises when it did
        not commit, a typed error where the failure is known."""

    async def after_failure(self, error: Exception) -> None:
        """After every try that raised (the handler's state may hold what did not commit)."""

    async def dead_letter(self, message: Msg, error: Exception) -> bool:
        """Set the message aside with its error, marked handled; False when that cannot be written."""

    async def degraded(self, error: Exception, *, unavailable: bool) -> None:
        """Handling started failing (`unavailable`: the ledger is away and batches are held)."""

    async def unhandled(self, error: Exception, message: Msg | None) -> None:
        """A message (None: the handler's work without messages) could not be handled nor set aside."""

    async def recovered(self) -> None:
        """Handling succeeds again after `degraded`."""

    async def settled(self, messages: Sequence[Msg]) -> None:
        """The messages are handled (acked, or dead-lettered): their effects are committed."""


class Deliveries:
    """What becomes of a fetched batch. Handled in one transaction, it is acked. When its handler raises:
    - `Unavailable`: with `holding` (the outage of what is away) the batch stays in hand and is tried again
      after a pause that grows, until it commits or `stopping()` (then it goes back to JetStream at once);
      without, it is naked after the error's delay (else `failing_delay`).
    - anything else, in a batch of several: the batch is handled again one message at a time, so no message
      takes its batch-mates with it.
    - alone, with `dead_letters`: a `TemporaryError` is redelivered after `retry_delay(deliveries)` until
      the message's last delivery but one; a fault of unknown kind once (one that passes unrecognised must
      not dead-letter a good message); a `PermanentError` not at all. Then the message is blamed only if
      the handler's work without it commits: it is dead-lettered and acked.
    - otherwise handling itself fails: the service is degraded, and the message is redelivered after
      `failing_delay(deliveries)` (without dead letters, until JetStream's max_deliver)."""

    def __init__(self, handler: Handler, *, log: logging.Logger, max_deliver: int,
                 retry_delay: Callable[[int], float], failing_delay: Callable[[int], float],
                 holding: Outage | None = None, stopping: Callable[[], bool] = lambda: False,
                 dead_letters: bool = False) -> None:
        self.handler = handler
        self.log = log
        self.max_deliver = max_deliver
        self.retry_delay, self.failing_delay = retry_delay, failing_delay
        self.holding = holding
        self.stopping = stopping
        self.dead_letters = dead_letters
        self.failing = False  # handling fails (degraded was called, recovered not yet)

    async def deliver(self, messages: Sequence[Msg]) -> None:
        """Handle the batch (none: the handler's work without messages) and settle each message."""
        while True:
            try:
                await self.handler.handle(messages)
            except Exception as error:  # whatever the handler raises: its kind (kind_of) decides below
                await self.handler.after_failure(error)
                if kind_of(error) is Unavailable:
                    if self.holding is not None:
                        if self.stopping():  # another replica takes them
                            for message in messages:
                                await PullConsumer.nak(message, None)
                            return
                        if not self.failing:
                            self.failing = True
                            await self.handler.degraded(error, unavailable=True)
                        await self.holding.failed(error)
                        continue
                    await self._fail(error, None)
                    for message in messages:
                        await PullConsumer.nak(message, _delay(error, self.failing_delay(_deliveries(message))))
                    return
                if len(messages) > 1:
                    self.log.warning("batch of %d failed (%s: %s); handling its messages one at a time",
                                     len(messages), type(error).__name__, str(error)[:300])
                    for message in messages:
                        await self.deliver([message])
                    return
                await self._alone(messages[0] if messages else None, error)
                return
            break
        if self.holding is not None:
            self.holding.ok()
        if self.failing:
            self.failing = False
            await self.handler.recovered()
        try:
            await PullConsumer.ack_all(messages)
        except BUS_ERRORS as error:  # committed: a redelivery finds them in the inbox
            self.log.warning("acks of %d committed message(s) failed (%s); their redelivery changes nothing",
                             len(messages), type(error).__name__)
        await self.handler.settled(messages)

    async def _alone(self, message: Msg | None, error: Exception) -> None:
        deliveries = _deliveries(message) if message is not None else 0
        if message is not None and self.dead_letters:
            if self._redelivered(error, deliveries):
                self.log.warning("a message could not be handled (%s); redelivering it", type(error).__name__)
                await PullConsumer.nak(message, _delay(error, self.retry_delay(deliveries)))
                return
            try:  # the message is at fault only when the work without it commits
                await self.handler.handle([])
            except Exception as without:  # whatever the handler raises: handling itself fails, reported below
                error = without
            else:
                if await self.handler.dead_letter(message, error):
                    with contextlib.suppress(*BUS_ERRORS):  # handled in the inbox: a redelivery changes nothing
                        await message.ack()
                    await self.handler.settled([message])
                    return
        await self._fail(error, message)
        if message is not None:
            await PullConsumer.nak(message, self.failing_delay(deliveries))

    def _redelivered(self, error: Exception, deliveries: int) -> bool:
        """Whether a message that failed alone is tried again rather than blamed."""
        if deliveries >= self.max_deliver - 1:
            return False
        kind = kind_of(error)
        return kind is not PermanentError and (kind is not None or deliveries < 2)

    async def _fail(self, error: Exception, message: Msg | None) -> None:
        if not self.failing:
            self.failing = True
            await self.handler.degraded(error, unavailable=False)
        await self.handler.unhandled(error, message)


def _deliveries(message: Msg) -> int:
    return int(message.metadata.num_delivered or 0)


def _delay(error: Exception, otherwise: float) -> float:
    """The delay a TemporaryError asks for, else the consumer's."""
    return error.delay if isinstance(error, TemporaryError) and error.delay is not None else otherwise
