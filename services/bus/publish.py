"""Publishing JSON on JetStream: one message awaiting its acknowledgement, or many pipelined (every one
sent before any acknowledgement is awaited)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from typing import Any

import orjson
from nats.js import JetStreamContext

from services.bus.cancel import raise_lost_cancel


async def publish_json(
    js: JetStreamContext, subject: str, payload: Any, *, msg_id: str | None = None
) -> Any:
    headers = {"Nats-Msg-Id": msg_id} if msg_id else None
    ack = await js.publish(subject, encode(payload), headers=headers)
    raise_lost_cancel()
    return ack


PUBLISH_ACK_TIMEOUT_S = 5.0


async def publish_pipelined(js: JetStreamContext, messages: Sequence[tuple[str, Any, str]],
                            ttls: Sequence[float | None] | None = None) -> None:
    """Publish (subject, payload, Nats-Msg-Id) in order, every message sent before any acknowledgement is
    awaited: one round trip for the lot instead of one each. Raises unless every
    one is acknowledged within PUBLISH_ACK_TIMEOUT_S; a resend is harmless, the ids dedupe it. `ttls`, one
    per message: seconds the stream keeps it (a Nats-TTL header; the stream must allow_msg_ttl), or None."""
    pending: list[asyncio.Future[Any]] = []
    try:
        for index, (subject, payload, message_id) in enumerate(messages):
            headers = {"Nats-Msg-Id": message_id}
            if ttls is not None and (ttl := ttls[index]) is not None:
                headers["Nats-TTL"] = f"{max(1, math.ceil(ttl))}s"
            pending.append(await js.publish_async(subject, encode(payload), headers=headers,
                                                  wait_stall=PUBLISH_ACK_TIMEOUT_S))
        raise_lost_cancel()
        done, waiting = await asyncio.wait(pending, timeout=PUBLISH_ACK_TIMEOUT_S)
        if waiting:
            raise TimeoutError(f"{len(waiting)} of {len(pending)} publishes not acknowledged within "
                               f"{PUBLISH_ACK_TIMEOUT_S:g}s")
        for future in done:
            future.result()  # a publish JetStream refused raises here
    finally:  # none left behind: an unanswered one holds one of nats-py's pending-publish places
        for future in pending:
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved, so asyncio does not report it as never retrieved
    raise_lost_cancel()


def encode(payload: Any) -> bytes:
    """JSON bytes of a payload: orjson, or the standard library for what orjson refuses (an integer beyond
    64 bits in a claim)."""
    try:
        return orjson.dumps(payload)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(payload).encode()
