"""How a service, the CLI or a test connects to NATS: reconnecting forever, an outage logged once, TLS
trusting the operator's CA."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

from nats import errors as nats_errors
from nats.aio.client import Client

from shared.contract import bus_auth

log = logging.getLogger("claimbroker.nats")

# What a call on NATS raises when the bus is away, refuses or does not answer in time: nats-py's errors
# (JetStream's are among them, its timeouts too) and the OSError of a dropped socket (TimeoutError is one).
BUS_ERRORS = (nats_errors.Error, OSError)


class ConnectionWatch:
    """How every service connects (nats-py's `connect` arguments, also its FastStream broker's): it
    reconnects forever, and says so once per outage in the log (nats-py's default logs a traceback for
    every failed try, twice a second). `client` is set once connected: a close is not an outage."""

    def __init__(self, url: str, name: str, tls_ca: Path | None = None) -> None:
        self.url, self.name, self.tls_ca = url, name, tls_ca
        self.shown = bus_auth.redact(url)  # what the log says: never a password
        self.client: Client | None = None
        self.lost = False

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "servers": [self.url], "name": self.name, "max_reconnect_attempts": -1, "reconnect_time_wait": 0.5,
            "disconnected_cb": self._disconnected, "reconnected_cb": self._reconnected, "error_cb": self._failed_try,
            **bus_auth.client_options(self.url)}
        if (tls := tls_context(self.tls_ca)) is not None:
            options["tls"] = tls
        return options

    async def _disconnected(self) -> None:  # nats-py calls it again after each failed try, and on close
        if not self.lost and not (self.client is not None and self.client.is_closed):
            log.warning("%s: connection to NATS at %s lost; reconnecting", self.name, self.shown)
        self.lost = True

    async def _reconnected(self) -> None:
        self.lost = False
        log.info("%s: reconnected to NATS at %s", self.name, self.shown)

    async def _failed_try(self, error: Exception) -> None:
        """nats-py reports failed reconnect tries here, and also errors of subscription callbacks and
        slow-consumer drops: the first kind once per outage (above), the others always."""
        if self.lost or isinstance(error, OSError | nats_errors.UnexpectedEOF | nats_errors.StaleConnectionError
                                   | nats_errors.NoServersError):
            log.debug("%s: NATS at %s: %r", self.name, self.shown, error)
        else:
            log.error("%s: NATS client error: %r", self.name, error, exc_info=error)


def tls_context(ca: Path | None) -> ssl.SSLContext | None:
    """A client context that trusts `ca` (a PEM bundle), for a server whose certificate the system's CAs do
    not sign; None without one (a tls:// URL then uses the system's CAs)."""
    return ssl.create_default_context(cafile=str(ca)) if ca is not None else None


async def connect(url: str, *, name: str, tls_ca: Path | None = None) -> Client:
    """A connection of its own (the CLI, tests, setup); the services use their FastStream broker's."""
    watch = ConnectionWatch(url, name, tls_ca)
    client = watch.client = Client()
    await client.connect(**watch.options())
    return client
