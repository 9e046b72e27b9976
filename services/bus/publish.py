"""Publishing JSON on JetStream: one message awaiting its acknowledgement, or many pipelined (every one
sent before any acknowledgement is awaited)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import weakref
from collections.abc import Sequence
from typing import Any

import orjson
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NoStreamResponseError

from services.bus.cancel import raise_lost_cancel


async def publish_json(
    js: JetStreamContext, subject: str, payload: Any, *, msg_id: str | None = None
) -> Any:
    headers = {"Nats-Msg-Id": msg_id} if msg_id else None
    ack = await js.publish(subject, encode(payload), headers=headers)
    raise_lost_cancel()
    return ack


PUBLISH_ACK_TIMEOUT_S = 5.0
NO_RESPONDERS = "503"  # the status nats-server answers a publish with when no stream takes its subject


class _Batch:
    """One pipelined call's publishes: every one answered on one reply subject, counted down."""

    __slots__ = ("done", "refused", "waiting")

    def __init__(self, size: int) -> None:
        self.waiting = size
        self.refused: BaseException | None = None  # the first publish JetStream refused
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class _Acknowledgements:
    """The PubAcks of a connection's pipelined publishes, on one subscription it takes once (`<inbox>.*`);
    each call's publishes share one reply subject and count down one future. What nats-py's publish_async
    does per message (a task to take its semaphore, a random token, a future and its callback, the ack parsed
    into a PubAck) cost more than the publish itself: the outbox relay's biggest part (issue 42)."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.prefix = f"{nc.new_inbox()}."
        self.batches: dict[str, _Batch] = {}
        self.serial = itertools.count()
        self.subscribed = False

    async def publish(self, messages: Sequence[tuple[str, Any, str]], ttls: Sequence[float | None] | None) -> None:
        if not self.subscribed:  # its SUB goes out before any call's first PUB, even a concurrent call's
            self.subscribed = True
            try:
                await self.nc.subscribe(f"{self.prefix}*", cb=self._acknowledged)
            except BaseException:
                self.subscribed = False
                raise
        reply = f"{self.prefix}{next(self.serial)}"
        batch = self.batches[reply] = _Batch(len(messages))
        try:
            for index, (subject, payload, message_id) in enumerate(messages):
                headers = {"Nats-Msg-Id": message_id}
                if ttls is not None and (ttl := ttls[index]) is not None:
                    headers["Nats-TTL"] = f"{max(1, math.ceil(ttl))}s"
                await self.nc.publish(subject, encode(payload), reply=reply, headers=headers)
            raise_lost_cancel()
            if messages:
                try:
                    await asyncio.wait_for(batch.done, PUBLISH_ACK_TIMEOUT_S)
                except TimeoutError:
                    raise TimeoutError(f"{batch.waiting} of {len(messages)} publishes not acknowledged within "
                                       f"{PUBLISH_ACK_TIMEOUT_S:g}s") from None
            if batch.refused is not None:
                raise batch.refused
        finally:
            del self.batches[reply]
        raise_lost_cancel()

    async def _acknowledged(self, msg: Msg) -> None:
        batch = self.batches.get(msg.subject)
        if batch is None:  # a call that timed out
            return
        if batch.refused is None:
            if msg.headers and msg.headers.get(api.Header.STATUS) == NO_RESPONDERS:
                batch.refused = NoStreamResponseError()
            elif b'"error"' in msg.data:  # a PubAck is parsed only where it may be a refusal
                answer = json.loads(msg.data)
                if "error" in answer:
                    try:
                        APIError.from_error(answer["error"])  # raises the error's own class
                    except APIError as refused:
                        batch.refused = refused
        batch.waiting -= 1
        if batch.waiting <= 0 and not batch.done.done():
            batch.done.set_result(None)


async def publish_pipelined(js: JetStreamContext, messages: Sequence[tuple[str, Any, str]],
                            ttls: Sequence[float | None] | None = None) -> None:
    """Publish (subject, payload, Nats-Msg-Id) in order, every message sent before any acknowledgement is
    awaited: one round trip for the lot instead of one each. Raises unless every
    one is acknowledged within PUBLISH_ACK_TIMEOUT_S; a resend is harmless, the ids dedupe it. `ttls`, one
    per message: seconds the stream keeps it (a Nats-TTL header; the stream must allow_msg_ttl), or None."""
    nc: NATS = js._nc  # noqa: SLF001 - nats-py keeps no public handle on a JetStream context's connection
    acknowledgements = _ACKNOWLEDGEMENTS.get(nc)
    if acknowledgements is None:
        acknowledgements = _ACKNOWLEDGEMENTS[nc] = _Acknowledgements(nc)
    await acknowledgements.publish(messages, ttls)


_ACKNOWLEDGEMENTS: weakref.WeakKeyDictionary[NATS, _Acknowledgements] = weakref.WeakKeyDictionary()


def encode(payload: Any) -> bytes:
    """JSON bytes of a payload: orjson, or the standard library for what orjson refuses (an integer beyond
    64 bits in a claim)."""
    try:
        return orjson.dumps(payload)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(payload).encode()
