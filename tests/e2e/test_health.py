"""`serve X` with CLAIMBROKER_HEALTH_PORT answers /healthz and /readyz: ready once the allocator has read
the inventory, 503 with why before."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.streams import ensure_streams
from services.runtime.health import answer
from services.watcher.files import FileWatcher
from tests.e2e.helpers import free_port
from tests.e2e.test_allocator_semantics import SLICE
from tests.private_postgres import PrivatePostgres

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("path", "why", "expected"), [
    ("/healthz", "NATS unreachable for 3s", (200, "ok")),
    ("/readyz", None, (200, "ready")),
    ("/readyz", "no inventory read yet", (503, "no inventory read yet")),
    ("/nothing", None, (404, "not found")),
])
def test_answers(path: str, why: str | None, expected: tuple[int, str]) -> None:
    assert answer(path, lambda: why)[:2] == expected


def test_metrics_are_prometheus_text() -> None:
    status, body, content_type = answer("/metrics", lambda: None)
    assert status == 200 and content_type.startswith("text/plain; version=")
    assert "# TYPE claimbroker_decisions_total counter" in body
    assert "# TYPE claimbroker_transaction_seconds histogram" in body



async def _readyz_until(base: str, done: Callable[[httpx.Response], bool], tries: int = 300) -> httpx.Response | None:
    """/readyz until `done` holds for its answer (or `tries` polls, 50 ms apart); the last answer."""
    ready = None
    for _ in range(tries):
        ready = await _get(base + "/readyz")
        if ready is not None and done(ready):
            break
        await asyncio.sleep(0.05)
    return ready


async def _publish_inventory(url: str, path: Path) -> None:
    path.write_text(SLICE)
    nc = await connect(url, name="watcher")
    await ensure_streams(nc.jetstream())
    await FileWatcher(nc.jetstream(), [path]).publish_once()
    await nc.close()


async def _get(url: str) -> httpx.Response | None:
    try:
        async with httpx.AsyncClient(timeout=2) as client:
            return await client.get(url)
    except httpx.TransportError:
        return None


async def test_serve_allocator_is_ready_once_it_has_the_inventory(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "CLAIMBROKER_HEALTH_PORT": str(port), "CLAIMBROKER_DATA_DIR": str(tmp_path / "data")}
    (tmp_path / "data").mkdir()
    migrate = await asyncio.create_subprocess_exec(sys.executable, "-m", "services.cli", "migrate", env=env,
                                                   stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    assert await migrate.wait() == 0
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "serve", "allocator", "--nats", nats_server.url, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        ready = await _readyz_until(base, lambda _: True)  # until the process listens
        assert ready is not None and (ready.status_code, ready.text) == (503, "no inventory read yet")
        live = await _get(base + "/healthz")
        assert live is not None and live.status_code == 200

        await _publish_inventory(nats_server.url, tmp_path / "slices.yaml")
        ready = await _readyz_until(base, lambda r: r.status_code == 200)
        assert ready is not None and (ready.status_code, ready.text) == (200, "ready")
    finally:
        process.terminate()
        await process.wait()


async def test_serve_allocator_started_while_postgresql_is_down_waits_for_it(
        nats_server: EmbeddedNats, private_postgres: PrivatePostgres, tmp_path: Path) -> None:
    """A deployed service often starts before its database (a node reboot, a rollout): it waits, says why
    on /readyz, and is ready once PostgreSQL is back, instead of exiting."""
    port = free_port()
    env = {**os.environ, "CLAIMBROKER_HEALTH_PORT": str(port), "CLAIMBROKER_DB": private_postgres.url,
           "CLAIMBROKER_DATA_DIR": str(tmp_path / "data")}
    migrate = await asyncio.create_subprocess_exec(sys.executable, "-m", "services.cli", "migrate", env=env,
                                                   stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    assert await migrate.wait() == 0
    await asyncio.to_thread(private_postgres.stop)
    await _publish_inventory(nats_server.url, tmp_path / "slices.yaml")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "serve", "allocator", "--nats", nats_server.url, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        ready = await _readyz_until(base, lambda r: "the ledger or NATS unreachable" in r.text)
        assert ready is not None and ready.status_code == 503, ready and ready.text
        assert "the ledger or NATS unreachable" in ready.text and process.returncode is None

        await asyncio.to_thread(private_postgres.start)
        ready = await _readyz_until(base, lambda r: r.status_code == 200)
        assert ready is not None and (ready.status_code, ready.text) == (200, "ready")
        assert process.returncode is None
    finally:
        process.terminate()
        assert await process.wait() == 0
