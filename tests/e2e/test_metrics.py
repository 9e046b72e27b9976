"""The services' Prometheus metrics move with what they do: decisions by state, transaction and cycle
times, the queue's depth per tenant and flavor, the consumer's lag, the outbox; the notifier's alerts."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.runtime.logs import BATCHES
from shared.contract import subjects
from tests.e2e.helpers import statuses
from tests.e2e.test_allocator_semantics import broker, claim, submit

pytestmark = pytest.mark.e2e


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_allocator_metrics_follow_its_decisions(nats_server: EmbeddedNats, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=BATCHES)
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    allocated = sample("claimbroker_decisions_total", state="Allocated")
    pending = sample("claimbroker_decisions_total", state="Pending")
    released = sample("claimbroker_decisions_total", state="Released")
    transactions = sample("claimbroker_transaction_seconds_count")
    cycles = sample("claimbroker_cycle_seconds_count")
    async with broker(nats_server, db_url, tmp_path) as b:
        await b.start_allocator(depth_interval=0)
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        await submit(nc, claim("fits"), "id-fits")
        await seen.wait_for(lambda: ("team", "fits") in seen.latest())
        too_big = claim("too-big")
        too_big["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2  # one GPU is left
        await submit(nc, too_big, "id-too-big")
        await seen.wait_for(lambda: ("team", "too-big") in seen.latest())
        assert sample("claimbroker_queue_depth", tenant="team", flavor="H100") == 1
        await publish_json(nc.jetstream(), subjects.release("team"), {"name": "too-big"}, msg_id="release-too-big")
        await seen.wait_for(lambda: seen.latest()[("team", "too-big")]["state"] == "Released")
        await nc.close()
    assert sample("claimbroker_decisions_total", state="Allocated") == allocated + 1
    assert sample("claimbroker_decisions_total", state="Pending") == pending + 1
    assert sample("claimbroker_decisions_total", state="Released") == released + 1
    assert sample("claimbroker_transaction_seconds_count") >= transactions + 2
    assert sample("claimbroker_cycle_seconds_count") >= cycles + 2
    assert sample("claimbroker_queue_depth", tenant="team", flavor="H100") == 0  # released: none waits
    assert sample("claimbroker_outbox_unpublished") == 0
    assert sample("claimbroker_consumer_pending_messages", consumer="allocator") == 0
    batches = [r for r in caplog.records if r.name == BATCHES and getattr(r, "messages", 0)]
    assert len(batches) >= 2 and {"Allocated", "Pending"} <= {s for r in batches for s in r.decided}  # type: ignore[attr-defined]
