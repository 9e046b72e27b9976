"""Test-side NATS helpers: collect statuses and alerts as they arrive and wait on conditions."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client

from shared.contract import subjects


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def failing_first(real: Callable[..., Awaitable[Any]], times: int, error: Exception) -> tuple[
        Callable[..., Awaitable[Any]], list[int]]:
    """`real`, raising `error` on its first `times` calls; the list holds the failures still to come."""
    left = [times]

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raise error
        return await real(*args, **kwargs)

    return wrapper, left


class Collector:
    """Every message on a subject pattern, in arrival order; `wait_for` blocks on a condition."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._changed = asyncio.Condition()

    async def start(self, nc: Client, subject: str) -> Collector:
        async def on_message(message: Any) -> None:
            async with self._changed:
                self.messages.append((message.subject, json.loads(message.data)))
                self._changed.notify_all()

        await nc.subscribe(subject, cb=on_message)
        await nc.flush()
        return self

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 20.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(condition), timeout)

    def latest(self) -> dict[tuple[str, str], dict[str, Any]]:
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for _, status in self.messages:
            out[(status["namespace"], status["name"])] = status
        return out

    def for_claim(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return [s for _, s in self.messages if (s.get("namespace"), s.get("name")) == (namespace, name)]


async def statuses(nc: Client) -> Collector:
    return await Collector().start(nc, subjects.STATUS_ALL)


async def alerts(nc: Client) -> Collector:
    return await Collector().start(nc, subjects.ALERTS_ALL)


T0 = 1_800_000_000.0  # a fixed "now" for tests that drive time themselves


class FakeClock:
    """A clock the test advances by hand (`clock.now += 30`), so nothing waits on real time."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now
