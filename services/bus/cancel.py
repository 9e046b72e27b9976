"""Cancels that nats-py swallows (cpython gh-86296, below): a loop raises them again after each nats-py
call, a shutdown cancels a task until it has ended."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


def raise_lost_cancel() -> None:
    """Raise the cancel that a nats-py call swallowed, if it did.

    nats-py awaits requests, JetStream acks and pull fetches with `asyncio.wait_for`, which on Python 3.11
    returns the reply instead of raising when a cancel lands just as the reply arrives (cpython gh-86296).
    The task is still marked as cancelling, so a loop that calls this after each such call stops as told;
    without it a task inside a TaskGroup is never cancelled again and its shutdown waits forever.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def wait_closed(task: asyncio.Task[Any], *, recancel_after: float = 2.0) -> None:
    """Cancel a task and wait until it has ended, whatever it raised.

    The cancel is repeated while the task runs on. On Python 3.11, `asyncio.wait_for` (nats-py awaits every
    request and JetStream ack with it) returns the reply instead of raising when a cancel lands just as the
    reply arrives (cpython gh-86296): the task then carries on as if never told to stop, and a shutdown
    that awaited it once would wait forever.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=recancel_after)
    if not task.cancelled():
        with contextlib.suppress(Exception):
            task.result()
