"""The services' frame (ServiceApp): each service is a FastStream app (its NatsBroker and the routers of what it
receives and sends, services/bus/channels.py), built by the service's app factory (`services/<name>/app.py`);
`up` and `serve` run them through `ServiceApp.run`.

FastStream carries what suits a handler per message: the inventory, read by the allocator and the
notifier through typed subscribers (an ordered consumer that replays the last inventory per node). Two paths
run on the broker's own nats-py connection instead, each for a reason measured or read in FastStream 0.7.8:
- Claims and statuses are consumed in batches, one ledger transaction per fetched batch, acked after it
  commits and held (not nacked) while the ledger is away (services/bus/consumer.py). FastStream's batch pull
  subscriber fetches until the batch is full or its timeout passes (its workaround for nats.py#1034), so at
  200 claims/s every claim would wait out the timeout, and it acks or nacks each handler call.
- Statuses go out pipelined (`services.bus.publish.publish_pipelined`: every publish sent, then the acks awaited
  together). `make bench-publish` (docs/performance.md) measures a FastStream publish awaiting each PubAck
  at less than half its rate, and FastStream publishes gathered per batch still a fifth slower, on the path
  that bounds the allocator's throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from faststream import ExceptionMiddleware, FastStream
from faststream.nats import NatsBroker, NatsRouter
from faststream.security import BaseSecurity
from nats.aio.client import Client
from pydantic import ValidationError

from services.bus.connection import ConnectionWatch

log = logging.getLogger("claimbroker.frame")
STOP_TIMEOUT_S = 5.0  # for stopping the app (its subscribers) on the way out

Main = Callable[[Client, Callable[[], Awaitable[None]]], Awaitable[None]]


def _unreadable(error: ValidationError) -> None:
    """A payload the contract's model refuses: one warning, and the subscriber goes on."""
    log.warning("ignoring a message that does not match its payload model: %s",
                "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:3]))


def _failed(error: Exception) -> None:
    """A handler's failure: logged with its trace (FastStream's own logging is off), and the subscriber
    goes on with the next message."""
    log.error("a message was not processed: %r", error, exc_info=error)


class ServiceApp:
    """One service as a FastStream app. `main(nc, subscribe)` is the service's own loop on the broker's
    connection; it calls `subscribe()` (through its outage handling) once the streams it needs exist,
    which starts the routers' subscribers."""

    def __init__(self, name: str, nats_url: str, main: Main, *routers: NatsRouter, service: Any = None,
                 not_ready: Callable[[], str | None] | None = None, tls_ca: Path | None = None) -> None:
        self.name = name
        self.watch = ConnectionWatch(nats_url, f"claimbroker-{name}", tls_ca)
        # logger=None: FastStream would log every failed reconnect try with a trace, and each message;
        # the connection's outages are logged once each (ConnectionWatch), handler failures below.
        options = self.watch.options()
        tls = options.pop("tls", None)  # FastStream takes it as its security
        self.broker = NatsBroker(**options, logger=None, security=BaseSecurity(ssl_context=tls) if tls else None,
                                 middlewares=[ExceptionMiddleware(handlers={ValidationError: _unreadable,
                                                                            Exception: _failed})])
        for router in routers:
            self.broker.include_router(router)
        self.app = FastStream(self.broker, logger=None)
        self.main = main
        self.service = service  # the Allocator, Notifier...: what tests and readiness look at
        self.not_ready = not_ready or (lambda: None)

    async def run(self) -> None:
        """Connect, run the service's loop until it ends or is cancelled, then close the connection and
        stop the app. Closed, not drained: nothing is acked that did not commit, what is in flight is
        redelivered, and with NATS gone a drain would wait for nothing."""
        nc = self.watch.client = await self.broker.connect()
        try:
            await self.main(nc, self.app.start)
        finally:
            await nc.close()
            with contextlib.suppress(Exception):  # its subscriptions are gone with the connection
                await asyncio.wait_for(self.app.stop(), STOP_TIMEOUT_S)
