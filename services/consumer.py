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
- Effects and acks stay with the service: it acks after its transaction commits (`ack_all`), and the
  inbox (shared.ledger.inbox), written in that transaction, makes a redelivery change nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig

from services import metrics
from services.natsio import raise_lost_cancel
from services.outage import Outage, until_done


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
        except Exception as error:  # noqa: BLE001 - an existing consumer it cannot change still serves
            self.log.warning("could not bring the %s consumer to this service's settings: %s", self.durable, error)
        return await self.js.pull_subscribe(self.subject, durable=self.durable, stream=self.stream, config=self.config)

    async def fetch(self, timeout: float) -> list[Msg]:
        """Up to `batch` messages; none when none came within `timeout` or NATS is away (then after a pause
        that grows with the outage)."""
        try:
            messages = list(await self._subscription.fetch(self.batch, timeout=timeout))
        except (NatsTimeout, TimeoutError):  # nats-py raises either when nothing arrived in time
            messages = []
        except Exception as error:  # noqa: BLE001 - NATS restarting or gone: wait, never exit
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
                    with contextlib.suppress(Exception):  # acked meanwhile, or the connection is down
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
        with contextlib.suppress(Exception):
            await message.nak(delay=delay)
