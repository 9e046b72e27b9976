"""End to end: a real nats-server, all four services, the lab workload over NATS, on SQLite and PostgreSQL."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.runtime.stack import running_stack
from shared.contract import subjects
from shared.settings import BrokerSettings
from tests.e2e.helpers import free_port, statuses

pytestmark = pytest.mark.e2e


def lab_claims(tenant: str) -> list[dict[str, Any]]:
    text = resources.files("shared.workloads").joinpath("lab.yaml").read_text()
    claims = [d for d in yaml.safe_load_all(text) if d]
    for claim in claims:
        claim["metadata"]["namespace"] = tenant
    return claims


async def test_lab_workload_end_to_end(nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path) -> None:
    settings = BrokerSettings(nats_url=nats_server.url, db=ledger_url, data_dir=tmp_path / "data",
                              api_port=free_port(), pending_alert_after=3600)
    async with running_stack(settings) as stack:
        assert stack.allocator is not None
        assert await stack.allocator.wait_for_inventory(20)
        nc = await connect(stack.nats_url, name="test")
        seen = await statuses(nc)
        claims = lab_claims("lab")
        for claim in claims:
            await publish_json(nc.jetstream(), subjects.submit("lab"), claim,
                               msg_id=f"test:{claim['metadata']['name']}")
        await seen.wait_for(lambda: len(seen.latest()) == len(claims))
        latest = seen.latest()

        greedy = [latest[("lab", f"gpu-greedy-{i}")] for i in range(1, 7)]
        assert [s["state"] for s in greedy] == ["Allocated"] * 4 + ["Pending"] * 2
        assert {s["allocation"]["nodeName"] for s in greedy[:4]} == {"node-01"}
        assert len({s["allocation"]["devices"]["results"][0]["device"] for s in greedy[:4]}) == 4
        for waiting in greedy[4:]:
            assert waiting["reason"] == "Insufficient nvidia.com/gpu: requested 1, free 0 of 4 on 1 node"

        training = latest[("lab", "training-gpu")]
        assert training["state"] == "Allocated"
        assert training["allocation"]["nodeName"] == "node-02"  # the fleet's whole-GPU H100 node

        pair = latest[("lab", "distributed-training")]
        assert pair["state"] == "Allocated"
        assert len(pair["allocation"]["devices"]["results"]) == 2

        async with httpx.AsyncClient(base_url=stack.api_url or "") as client:
            assert (await client.get("/healthz")).status_code == 200

        # Releasing one greedy claim lets the first waiting one in, in arrival order.
        await publish_json(nc.jetstream(), subjects.release("lab"), {"name": "gpu-greedy-2"}, msg_id="rel-2")
        await seen.wait_for(lambda: seen.latest()[("lab", "gpu-greedy-5")]["state"] == "Allocated")
        assert seen.latest()[("lab", "gpu-greedy-2")]["state"] == "Released"
        assert seen.latest()[("lab", "gpu-greedy-6")]["state"] == "Pending"
        await nc.close()
