"""The notifier against a real nats-server: a rejected claim alerts at once, a waiting claim alerts after
the threshold, exactly once, and its alert is resolved when the claim stops waiting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.runtime.stack import running_stack
from shared.contract import subjects
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.helpers import alerts, statuses
from tests.e2e.test_allocator_semantics import SLICE

pytestmark = pytest.mark.e2e


async def test_rejected_and_pending_too_long_alerts(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    inventory = tmp_path / "slices.yaml"
    inventory.write_text(SLICE)
    settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data", inventory=[inventory],
                              pending_alert_after=0.3)
    sent = REGISTRY.get_sample_value("claimbroker_alerts_sent_total",
                                     {"kind": "claim-pending-too-long", "severity": "warning", "resolved": "true"})
    async with running_stack(settings, services=("watcher", "allocator", "notifier")) as stack:
        assert stack.allocator is not None and await stack.allocator.wait_for_inventory(20)
        nc = await connect(stack.nats_url, name="test")
        seen, alarms = await statuses(nc), await alerts(nc)
        js = nc.jetstream()
        await publish_json(js, subjects.submit("team"), a_claim("big", "team").request(count=3).document(),
                           msg_id="big")
        await publish_json(js, subjects.submit("team"),
                           a_claim("typo", "team").request(selectors=("device.attributes[",)).document(),
                           msg_id="typo")

        def kinds() -> list[tuple[str, bool]]:
            return [(a["kind"], a["resolved"]) for _, a in alarms.messages]

        await alarms.wait_for(lambda: ("claim-pending-too-long", False) in kinds())
        rejected = [a for _, a in alarms.messages if a["kind"] == "claim-rejected"]
        assert len(rejected) == 1 and rejected[0]["key"] == "claim-rejected:team/typo"
        assert "CEL compile error" in rejected[0]["summary"]
        waiting = next(a for _, a in alarms.messages if a["kind"] == "claim-pending-too-long")
        assert waiting["labels"] == {"tenant": "team", "claim": "big"}
        assert "requested 3, free 2 of 2 on 1 node" in waiting["summary"]

        await publish_json(js, subjects.release("team"), {"name": "big"}, msg_id="release-big")
        await alarms.wait_for(lambda: ("claim-pending-too-long", True) in kinds())
        await seen.wait_for(lambda: seen.latest()[("team", "big")]["state"] == "Released")
        assert kinds().count(("claim-pending-too-long", False)) == 1
        def resolved_sent() -> float:  # counted once the publish is acknowledged, just after we saw it
            return REGISTRY.get_sample_value("claimbroker_alerts_sent_total", {
                "kind": "claim-pending-too-long", "severity": "warning", "resolved": "true"}) or 0.0

        for _ in range(100):
            if resolved_sent() > (sent or 0):
                break
            await asyncio.sleep(0.05)
        assert resolved_sent() == (sent or 0) + 1
        subjects_seen = {s for s, _ in alarms.messages}
        # 3 GPUs on a 2-GPU node can never fit: the allocator flags it and the notifier says so at once.
        assert subjects_seen == {"claimbroker.v1.alerts.warning.claim-rejected.team",
                                 "claimbroker.v1.alerts.warning.claim-pending-too-long.team",
                                 "claimbroker.v1.alerts.critical.claim-unsatisfiable.team"}
        await nc.close()
