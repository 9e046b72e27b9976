"""`up` supervises its services: one that ends on its own is started again after a wait, one that keeps
failing (or cannot run with its settings) stops the broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.bus.cancel import wait_closed
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.runtime.stack import RestartPolicy, running_stack, supervise
from shared.settings import BrokerSettings
from tests.e2e.helpers import statuses
from tests.e2e.test_allocator_semantics import claim, submit

pytestmark = pytest.mark.e2e
QUICK = RestartPolicy(first_wait=0.1, most_wait=0.2, most_restarts=2, window=60)


async def test_a_service_that_ends_is_restarted_and_goes_on_deciding(nats_server: EmbeddedNats,
                                                                      tmp_path: Path) -> None:
    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data")
    async with running_stack(settings, services=("watcher", "allocator")) as stack:
        stop = asyncio.Event()
        supervisor = asyncio.create_task(supervise(stack, settings, stop, QUICK))
        first = stack.tasks["allocator"]
        await wait_closed(first)  # as if it had crashed
        while stack.tasks["allocator"] is first:
            await asyncio.sleep(0.05)
        assert stack.allocator is not None and await stack.allocator.wait_for_inventory(20)
        nc = await connect(nats_server.url, name="tenant")
        seen = await statuses(nc)
        await submit(nc, claim("after-restart"), "id-after-restart")
        await seen.wait_for(lambda: ("team", "after-restart") in seen.latest())
        assert seen.latest()[("team", "after-restart")]["state"] == "Allocated"
        await nc.close()
        stop.set()
        assert await supervisor is True


async def test_a_service_that_keeps_ending_stops_the_broker(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data")
    async with running_stack(settings, services=("allocator",)) as stack:
        supervisor = asyncio.create_task(supervise(stack, settings, asyncio.Event(), QUICK))
        for _ in range(QUICK.most_restarts + 1):
            task = stack.tasks["allocator"]
            await wait_closed(task)
            while stack.tasks["allocator"] is task and not supervisor.done():
                await asyncio.sleep(0.05)
        assert await asyncio.wait_for(supervisor, 10) is False


async def test_a_killed_up_takes_its_nats_server_along(tmp_path: Path) -> None:
    """`kill -9` of `up`: its embedded nats-server (in a session of its own, out of reach of the terminal's
    Ctrl-C) gets its death signal from the kernel and is gone within seconds, store and port freed."""
    import os
    import signal
    import sys

    data = tmp_path / "data"
    up = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "--data-dir", str(data), "up", "--api-port", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(1200):  # `up` writes nats.url once its stack runs
            if (data / "nats.url").exists() or up.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert (data / "nats.url").exists(), "up did not start"
        server = int((data / "nats" / "nats-server.pid").read_text())
        assert _alive(server) and os.getsid(server) != os.getsid(up.pid)
    finally:
        up.send_signal(signal.SIGKILL)
        await up.wait()
    for _ in range(200):
        if not _alive(server):
            break
        await asyncio.sleep(0.05)
    outlived = _alive(server)
    if outlived:
        os.kill(server, signal.SIGKILL)  # a failing run leaves no server behind either
    assert not outlived, "the nats-server outlived its `up`"


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent to notice."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
