"""`up` supervises its services: one that ends on its own is started again after a wait, one that keeps
failing (or cannot run with its settings) stops the broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.natsio import EmbeddedNats, connect, wait_closed
from services.stack import RestartPolicy, running_stack, supervise
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
