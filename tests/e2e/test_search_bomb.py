"""Claims that exhaust the placement search, on the live stack (`claimbroker up` on PostgreSQL): another
tenant's claims are answered about as fast as alone, and the broker's memory stays within twice its quiet
size and takes nothing more when they end and as many come again (issue 35's compute bomb: 32 requests, each
a firstAvailable of 8 subrequests with selectors of their own, under a matchAttribute on the GPU's uuid).
Ratios against a baseline taken in the same test, never absolute times."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import nats
import pytest
import yaml

from bench.e2e import Broker, Statuses, load_quotas, quota_document, topology
from bench.flood import BOMB, CALM, bomb_phase, calm_phase, one_gpu, publish_patiently, resident_mb
from shared.contract import bus_auth, subjects

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(900)]

NODES = 40
CALM_CLAIMS, CALM_RATE = 30, 10.0


def p50_ms(latencies: list[float]) -> float:
    return statistics.median(latencies) * 1000


async def test_claims_that_exhaust_the_search_wait_their_turn_and_slow_no_one(postgres_url: str,
                                                                           tmp_path: Path) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(yaml.safe_dump(topology(NODES)))
    await load_quotas(postgres_url, quota_document(3, NODES))
    broker = Broker(tmp_path, inventory, postgres_url, {"CLAIMBROKER_TENANT_BACKLOG": "16"})
    broker.start()
    try:
        url = await broker.nats_url()
        nc = await nats.connect(url, **bus_auth.client_options(url))
        statuses = Statuses()
        await nc.subscribe(subjects.STATUS_ALL, cb=statuses.on_status)
        js = nc.jetstream()
        deadline = time.monotonic() + 120
        while (CALM, "probe") not in statuses.allocated:  # the fleet is in and the allocator answers
            broker.alive()
            assert time.monotonic() < deadline, broker.tail()
            await js.publish(subjects.submit(CALM), json.dumps(one_gpu(CALM, "probe")).encode())
            await asyncio.sleep(0.5)
        await js.publish(subjects.release(CALM), json.dumps({"name": "probe"}).encode())
        await calm_phase(js, statuses, 10, CALM_RATE, "warm")  # the process at its working size
        alone = p50_ms(await calm_phase(js, statuses, CALM_CLAIMS, CALM_RATE, "alone"))
        assert broker.process is not None
        quiet_mb = resident_mb(broker.process.pid)

        figures = {}
        for first, count in ((0, 50), (50, 150)):
            await bomb_phase(js, statuses, count, first)
            figures[first + count] = p50_ms(await calm_phase(js, statuses, CALM_CLAIMS, CALM_RATE, f"b{first}"))
        loaded_mb = resident_mb(broker.process.pid)

        states = {state for (tenant, _), (_, state) in statuses.last.items() if tenant == BOMB}
        assert states == {"Pending"}, states  # every bomb answered, none placed, none refused
        for bombs, p50 in figures.items():
            assert p50 <= 2 * alone + 25, (bombs, p50, alone, figures)  # 25 ms: one transaction's noise
        assert loaded_mb <= 2 * quiet_mb, (loaded_mb, quiet_mb)

        # their memory is returned when they end: as many again after they are released take no more
        bombs = [key for key in statuses.last if key[0] == BOMB]
        for tenant, name in bombs:
            await publish_patiently(js, subjects.release(tenant), json.dumps({"name": name}).encode(), f"r-{name}")
        deadline = time.monotonic() + 120
        while any(statuses.last[key][1] != "Released" for key in bombs):
            assert time.monotonic() < deadline, broker.tail()
            await asyncio.sleep(0.05)
        await bomb_phase(js, statuses, 200, 1_000)
        again_mb = resident_mb(broker.process.pid)
        assert again_mb <= 1.15 * loaded_mb, (again_mb, loaded_mb, quiet_mb)
        await nc.close()
    finally:
        assert await broker.stop() == 0, broker.tail()
