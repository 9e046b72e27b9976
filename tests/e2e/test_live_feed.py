"""The usage page's live feed (GET /v1/events) against a real nats-server: what each viewer is sent, cut to
its token; heartbeats held back; a listener too slow gets one resync; a revoked token and a stopping server
end the stream."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import select

from services.admin_api import live
from services.admin_api.app import create_app
from services.admin_api.live import LiveFeed
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from shared.contract import events, subjects
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import ApiToken
from shared.ledger.tokens import create_token, hash_token, revoke_token

pytestmark = pytest.mark.e2e


@dataclass
class Served:
    url: str
    feed: LiveFeed
    nc: Any
    factory: Any
    everyone: str
    speech: str

    async def publish(self, subject: str, payload: dict[str, Any]) -> None:
        await self.nc.publish(subject, json.dumps(payload).encode())
        await self.nc.flush()


@pytest.fixture
async def served(nats_server: EmbeddedNats, tmp_path: Path) -> AsyncIterator[Served]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(url)
    engine = create_engine(url)
    factory = sessions(engine)
    feed = LiveFeed(lambda: connect(nats_server.url, name="live-test"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine, live_feed=feed), log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=5))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    nc = await connect(nats_server.url, name="test")
    while not server.started:
        await asyncio.sleep(0.02)
    yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", feed, nc, factory,
                 await create_token(factory, "viewer", None), await create_token(factory, "viewer", "speech"))
    await feed.close()
    server.should_exit = True
    await serving
    await nc.close()
    sock.close()
    await engine.dispose()


class Stream:
    """One open /v1/events response, read event by event."""

    def __init__(self, response: httpx.Response) -> None:
        self.blocks = response.aiter_text()
        self.buffer = ""

    async def next(self, timeout: float = 10.0) -> tuple[str, dict[str, Any]]:
        while "\n\n" not in self.buffer:
            self.buffer += await asyncio.wait_for(anext(self.blocks), timeout)
        block, self.buffer = self.buffer.split("\n\n", 1)
        if block.startswith(":"):  # a keepalive comment
            return await self.next(timeout)
        kind = next((line[6:].strip() for line in block.splitlines() if line.startswith("event:")), "message")
        data = "".join(line[5:].strip() for line in block.splitlines() if line.startswith("data:"))
        return kind, json.loads(data or "{}")


def status(tenant: str, name: str, state: str, device: str | None = None) -> dict[str, Any]:
    allocation = {"nodeName": "n1", "devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": device}]}} if device else None
    return {"namespace": tenant, "name": name, "state": state, "allocation": allocation, "sequence": 1,
            "observedAt": "2026-12-06T00:00:00Z"}


async def open_stream(client: httpx.AsyncClient, served: Served, token: str) -> AsyncIterator[Stream]:
    async with client.stream("GET", f"{served.url}/v1/events", headers={"Authorization": f"Bearer {token}"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        stream = Stream(r)
        assert await stream.next() == ("hello", {})
        yield stream


async def test_each_viewer_is_sent_what_its_token_may_see(served: Served) -> None:
    async with httpx.AsyncClient(timeout=None) as client:
        everyone_streams = open_stream(client, served, served.everyone)
        speech_streams = open_stream(client, served, served.speech)
        everyone, speech = await anext(everyone_streams), await anext(speech_streams)

        await served.publish(subjects.status("vision", "train"), status("vision", "train", "Allocated", "gpu-3"))
        device = {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"}
        assert await everyone.next() == ("message", {"type": "status", "tenant": "vision", "claim": "train",
                                                     "state": "Allocated", "devices": [device], "node": "n1"})
        assert await speech.next() == ("message", {"type": "status", "tenant": None, "claim": None,
                                                   "state": "Allocated", "devices": [device], "node": "n1"})

        inventory = events.inventory_payload("n1", [], labels={"zone": "a"}, sequence=1, observed_at=1.0)
        await served.publish(subjects.inventory("n1"), inventory)
        await served.publish(subjects.inventory("n1"), {**inventory, "sequence": 2, "observedAtUnix": 2.0})  # heartbeat
        await served.publish(subjects.alert("warning", "claim-pending-too-long"),
                             {"key": "claim-pending-too-long:vision/x", "labels": {"tenant": "vision"},
                              "resolved": False})
        await served.publish(subjects.status("speech", "asr"), status("speech", "asr", "Released"))
        assert [await everyone.next() for _ in range(3)] == [
            ("message", {"type": "inventory", "node": "n1"}),
            ("message", {"type": "alert", "key": "claim-pending-too-long:vision/x", "resolved": False}),
            ("message", {"type": "status", "tenant": "speech", "claim": "asr", "state": "Released", "devices": [],
                         "node": None})]
        # the heartbeat was not sent, nor vision's alert to speech's viewer
        assert [await speech.next() for _ in range(2)] == [
            ("message", {"type": "inventory", "node": "n1"}),
            ("message", {"type": "status", "tenant": "speech", "claim": "asr", "state": "Released", "devices": [],
                         "node": None})]
        await everyone_streams.aclose()
        await speech_streams.aclose()


async def test_a_listener_too_slow_gets_one_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "QUEUE_LIMIT", 3)
    listener = live.Listener(None)
    for i in range(10):  # more than its queue holds, before it reads one
        listener.offer({"type": "status", "claim": f"c{i}"})
    received = [await listener.next(1.0) for _ in range(4)]
    assert received == [{"type": "status", "claim": "c0"}, {"type": "status", "claim": "c1"},
                        {"type": "status", "claim": "c2"}, {"type": "resync"}]
    listener.offer({"type": "status", "claim": "after"})
    assert await listener.next(1.0) == {"type": "status", "claim": "after"}
    assert await listener.next(0.01) is None, "nothing more: a keepalive is due"
    listener.end()
    assert await listener.next(1.0) is live.END


async def test_a_revoked_token_and_a_stopping_server_end_the_stream(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "TOKEN_RECHECK_S", 0.2)
    async with httpx.AsyncClient(timeout=None) as client:
        streams = open_stream(client, served, served.speech)
        stream = await anext(streams)
        async with served.factory() as s, s.begin():
            token_id = await s.scalar(select(ApiToken.id).where(ApiToken.token_hash == hash_token(served.speech)))
        assert token_id is not None
        async with served.factory() as s, s.begin():
            await revoke_token(s, token_id, "test")
        assert await stream.next() == ("bye", {"reason": "the token was revoked or has expired"})
        await streams.aclose()
        refused = await client.get(f"{served.url}/v1/events", headers={"Authorization": f"Bearer {served.speech}"})
        assert refused.status_code == 401

        streams = open_stream(client, served, served.everyone)
        stream = await anext(streams)
        await served.feed.close()
        assert await stream.next() == ("bye", {"reason": "the server is stopping"})
        await streams.aclose()


async def test_without_a_bus_the_feed_is_a_503(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(url)
    engine = create_engine(url)
    token = await create_token(sessions(engine), "viewer", None)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine)),
                                     base_url="http://api") as client:
            answer = await client.get("/v1/events", headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 503  # the page then polls
            assert (await client.get("/v1/events")).status_code == 401
    finally:
        await engine.dispose()
