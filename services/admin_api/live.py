"""GET /v1/events: the usage page's live feed, server-sent events over the broker's own events.

One NATS connection per API process (opened with the first listener) subscribes to claim statuses,
inventory and alerts and fans them out to every open stream, each through a bounded queue: a listener
too slow to keep up gets one `resync` (reload everything) instead of an ever-growing backlog.

What a listener sees is cut to its token: a tenant-scoped viewer gets its own tenant's statuses whole,
and of another tenant's only which devices were taken or freed (what the node map shows anyway, without
the holder); alerts of other tenants are not sent at all. Inventory heartbeats that change nothing are
not forwarded. The token is checked again every TOKEN_RECHECK_S: a revoked or expired one ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.admin_api.access import Caller, Principal
from services.admin_api.problems import PROBLEMS
from services.bus.connection import BUS_ERRORS
from shared.contract import subjects
from shared.contract.messages import UnreadableStatus, read_status
from shared.ledger.tokens import still_usable

log = logging.getLogger("claimbroker.admin_api")
router = APIRouter(responses=PROBLEMS)
QUEUE_LIMIT = 1000
KEEPALIVE_S = 15.0
TOKEN_RECHECK_S = 30.0
RESYNC: dict[str, Any] = {"type": "resync"}
END: dict[str, Any] = {"type": "end"}  # the process is stopping: the stream ends, the page tries again later


@dataclass(eq=False)
class Listener:
    tenant: str | None  # None: sees every tenant
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=lambda: asyncio.Queue(QUEUE_LIMIT))
    behind: bool = False  # dropped events: owes a resync

    def offer(self, event: dict[str, Any]) -> None:
        if self.behind:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.behind = True

    def end(self) -> None:
        while not self.queue.empty():  # room for the end, however far behind the listener is
            self.queue.get_nowait()
        self.behind = False
        self.queue.put_nowait(END)

    async def next(self, timeout: float) -> dict[str, Any] | None:
        if self.behind and self.queue.empty():
            self.behind = False
            return RESYNC
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return None


class LiveFeed:
    """The broker's events, fanned out to the page's streams. `connect` opens the NATS connection (the
    API process's own identity); nothing connects until someone listens."""

    def __init__(self, connect: Callable[[], Awaitable[Client]]) -> None:
        self._connect = connect
        self._nc: Client | None = None
        self._opening = asyncio.Lock()
        self._listeners: set[Listener] = set()
        self._inventory: dict[str, str] = {}  # node -> digest of its last forwarded content

    async def listen(self, tenant: str | None) -> Listener:
        async with self._opening:
            if self._nc is None:
                nc = await self._connect()
                for subject, handler in ((subjects.STATUS_ALL, self._on_status),
                                         (subjects.INVENTORY_ALL, self._on_inventory),
                                         (subjects.ALERTS_ALL, self._on_alert)):
                    await nc.subscribe(subject, cb=handler)
                self._nc = nc
        listener = Listener(tenant)
        self._listeners.add(listener)
        return listener

    def leave(self, listener: Listener) -> None:
        self._listeners.discard(listener)

    async def close(self) -> None:
        """Ends every stream (a server waits for open responses before it stops) and the connection."""
        for listener in self._listeners:
            listener.end()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None

    async def _on_status(self, message: Msg) -> None:
        if not self._listeners:  # nobody watches: not even parsed
            return
        try:
            status = read_status(message.data)
        except UnreadableStatus:
            return
        tenant, claim, allocation = status["namespace"], status["name"], status.get("allocation")
        devices = [{"driver": r["driver"], "pool": r["pool"], "device": r["device"]}
                   for r in (allocation["devices"]["results"] if allocation else ())]
        whole = {"type": "status", "tenant": tenant, "claim": claim, "state": status["state"],
                 "devices": devices, "node": allocation["nodeName"] if allocation else None}
        anonymous = {**whole, "tenant": None, "claim": None}
        for listener in self._listeners:
            listener.offer(whole if listener.tenant in (None, tenant) else anonymous)

    async def _on_inventory(self, message: Msg) -> None:
        if not self._listeners:  # nobody watches: not even parsed
            return
        inventory = _json(message)
        if inventory is None or not isinstance(inventory.get("node"), str):
            return
        node = inventory["node"]
        content = {k: inventory.get(k) for k in ("removed", "labels", "telemetry", "slices")}
        digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()
        if self._inventory.get(node) == digest:
            return  # a heartbeat
        self._inventory[node] = digest
        for listener in self._listeners:
            listener.offer({"type": "inventory", "node": node})

    async def _on_alert(self, message: Msg) -> None:
        if not self._listeners:  # nobody watches: not even parsed
            return
        alert = _json(message)
        if alert is None:
            return
        tenant = (alert.get("labels") or {}).get("tenant")
        for listener in self._listeners:
            if listener.tenant is None or listener.tenant == tenant:
                listener.offer({"type": "alert", "key": alert.get("key"), "resolved": alert.get("resolved")})


def _json(message: Msg) -> dict[str, Any] | None:
    try:
        value = json.loads(message.data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@router.get("/v1/events", tags=["usage"], response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}},
                             "description": "`event: hello` first, then `data:` lines of status, inventory, "
                                            "alert and resync events, a keepalive comment every 15 s"}})
async def events(request: Request, token: Caller) -> StreamingResponse:
    """What changes, as it happens, for the usage page (server-sent events; send the token as a bearer
    header, so read it with fetch rather than EventSource)."""
    feed: LiveFeed | None = getattr(request.app.state, "live", None)
    if feed is None:
        raise HTTPException(503, "this API process has no view of the bus (run it with the broker, or with NATS)")
    try:
        listener = await feed.listen(token.tenant)
    except (*BUS_ERRORS, TimeoutError) as error:
        log.warning("live feed unavailable: %s", error)
        raise HTTPException(503, "the bus does not answer; the page falls back to polling") from None
    return StreamingResponse(_stream(request, feed, listener, token), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _stream(request: Request, feed: LiveFeed, listener: Listener, token: Principal) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    recheck = loop.time() + TOKEN_RECHECK_S
    try:
        yield "event: hello\ndata: {}\n\n"
        while True:
            event = await listener.next(min(KEEPALIVE_S, max(0.1, recheck - loop.time())))
            if event is END:
                yield "event: bye\ndata: {\"reason\": \"the server is stopping\"}\n\n"
                return
            if loop.time() >= recheck:
                recheck = loop.time() + TOKEN_RECHECK_S
                if not await _still_usable(request, token):
                    yield "event: bye\ndata: {\"reason\": \"the token was revoked or has expired\"}\n\n"
                    return
            yield f"data: {json.dumps(event)}\n\n" if event is not None else ": keepalive\n\n"
    finally:
        feed.leave(listener)


async def _still_usable(request: Request, token: Principal) -> bool:
    async with request.app.state.sessions() as s:
        return await still_usable(s, token.id)
