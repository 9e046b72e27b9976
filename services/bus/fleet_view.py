"""The fleet as the bus has it, kept current in a process that does not run the allocator: what /v1/nodes
shows when the allocator runs in a process of its own (`up`), and what start estimates run on beside it.
One ordered consumer replays every node's last inventory and then
follows each new one, so a page's poll reads memory instead of replaying the stream per request. Each
message is read whole (heartbeats too): a node's observed time is when it was last heard, as the node map
judges freshness by. Until the replay has caught up, `current()` waits for it (a fleet half read would show
nodes missing)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.js.api import DeliverPolicy

from shared.contract import subjects
from shared.contract.events import read_inventory
from shared.dra import model as dra
from shared.dra.inventory import Fleet

log = logging.getLogger("claimbroker.bus")
CATCH_UP_S = 30.0  # how long `current()` waits for the first replay


class FleetView:
    """`connect`: the connection to follow the stream on; closed with the view when `owns_connection`."""

    def __init__(self, connect: Callable[[], Awaitable[Client]], *, owns_connection: bool = True) -> None:
        self.connect = connect
        self.owns_connection = owns_connection
        self.fleet = Fleet()
        self.caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def current(self, timeout: float = CATCH_UP_S, *, strict: bool = False) -> Fleet:
        """The fleet once the replay has caught up (started with the first call). After `timeout`, what it
        has read, or (`strict`) TimeoutError; a follower that failed (the bus away) raises its error."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._follow(), name="fleet-view")
        caught_up = asyncio.create_task(self.caught_up.wait())
        try:
            await asyncio.wait([caught_up, self._task], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            caught_up.cancel()
        if not self.caught_up.is_set():
            if self._task.done() and not self._task.cancelled() and self._task.exception() is not None:
                raise self._task.exception()  # type: ignore[misc]
            if strict:
                raise TimeoutError(f"the inventory stream was not read within {timeout:g}s")
        return self.fleet

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _follow(self) -> None:
        nc = await self.connect()
        try:
            js = nc.jetstream()
            if not (await js.stream_info(subjects.INVENTORY_STREAM)).state.messages:
                self.caught_up.set()  # nothing published yet: the empty fleet is the bus's
            subscription = await js.subscribe(subjects.INVENTORY_ALL, ordered_consumer=True,
                                              deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, cb=self._on_message)
            try:
                await asyncio.Event().wait()  # until closed
            finally:
                if not self.owns_connection:
                    with contextlib.suppress(Exception):
                        await subscription.unsubscribe()
        finally:
            if self.owns_connection:
                await nc.close()

    async def _on_message(self, message: Any) -> None:
        try:
            inventory = read_inventory(json.loads(message.data))
        except (ValueError, dra.DocumentError) as error:
            log.warning("the fleet view ignores an invalid inventory message: %s", error)
        else:
            self.fleet = self.fleet.with_node(inventory)
        if message.metadata.num_pending == 0:
            self.caught_up.set()
