"""The allocator with quotas against a real nats-server and real databases: two allocators on one ledger
never double-allocate nor exceed a quota, a quota change reaches the next cycle without a restart,
preemption publishes Preempted then Pending, a lost node sends its claims back (again, if the cycle that did
it rolls back), stale nodes get nothing."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from services.allocator.service import Allocator
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.watcher.files import FileWatcher
from shared.admission.quota import parse_quotas
from shared.contract import subjects
from shared.ledger.engine import sessions
from shared.ledger.quota_store import apply_quota_config
from shared.ledger.schema import Claim, ClaimEvent, DeviceAllocation
from tests.builders import a_claim
from tests.e2e.helpers import statuses
from tests.e2e.test_allocator_semantics import broker

pytestmark = pytest.mark.e2e

FLEET = """kind: Topology
nodes:
  - {name: h1, gpuModel: H100, gpuCount: 4}
  - {name: h2, gpuModel: H100, gpuCount: 4}
"""


async def set_quotas(engine: Any, document: dict[str, Any]) -> None:
    async with sessions(engine)() as session, session.begin():
        await apply_quota_config(session, parse_quotas(document), "test")


def claim(name: str, tenant: str, count: int = 1, priority: int = 0) -> dict[str, Any]:
    builder = a_claim(name, tenant).request(count=count)
    builder.annotations["claimbroker.io/priority"] = str(priority)
    return builder.document()


async def use_fleet(nats_url: str, path: Path) -> tuple[Any, FileWatcher]:
    """Publish FLEET from `path`; the caller closes the returned connection (and may republish)."""
    path.write_text(FLEET)
    nc = await connect(nats_url, name="watcher")
    publisher = FileWatcher(nc.jetstream(), [path])
    await publisher.publish_once()
    return nc, publisher


async def test_two_allocators_never_double_allocate_or_exceed_a_quota(
    nats_server: EmbeddedNats, db_url: str, tmp_path: Path
) -> None:
    async with broker(nats_server, db_url, tmp_path) as b:
        watcher, _ = await use_fleet(b.url, b.inventory)
        await set_quotas(b.engine, {"kind": "Quotas", "tenants": [
            {"name": "a", "cohort": "c", "quotas": {"H100": {"nominal": 3, "borrowingLimit": 1}}},
            {"name": "b", "cohort": "c", "quotas": {"H100": {"nominal": 3}}},
        ]})
        first = await b.start_allocator(batch=3, cycle_interval=0.1)
        second = await b.start_allocator(batch=3, cycle_interval=0.1)
        await asyncio.sleep(0)  # both are serving the same durable consumer
        nc = await connect(b.url, name="tenants")
        seen = await statuses(nc)
        names = [(t, f"{t}{i}") for i in range(8) for t in ("a", "b")]
        for tenant, name in names:
            await publish_json(nc.jetstream(), subjects.submit(tenant), claim(name, tenant), msg_id=name)
        await seen.wait_for(lambda: len(seen.latest()) == len(names), timeout=60)
        async with sessions(b.engine)() as session:
            rows = (await session.execute(select(DeviceAllocation.driver, DeviceAllocation.pool,
                                                 DeviceAllocation.device, Claim.namespace)
                                          .join(Claim, Claim.id == DeviceAllocation.claim_id))).all()
        devices = Counter((r[0], r[1], r[2]) for r in rows)
        assert max(devices.values()) == 1
        per_tenant = Counter(r[3] for r in rows)
        # 10 H100s (h1, h2 and the fixture's n1): a stops at nominal 3 + borrowingLimit 1; b, with no
        # borrowing limit, takes the rest (its nominal 3 and the 4 no nominal quota covers, less a's 1).
        assert per_tenant == {"a": 4, "b": 6}
        assert {first, second} <= set(b.tasks)
        await nc.close()
        await watcher.close()


async def test_quota_change_reaches_the_next_cycle_and_preemption_is_announced(
    nats_server: EmbeddedNats, db_url: str, tmp_path: Path
) -> None:
    async with broker(nats_server, db_url, tmp_path) as b:
        watcher, _ = await use_fleet(b.url, b.inventory)
        await set_quotas(b.engine, {"kind": "Quotas", "tenants": [
            {"name": "a", "quotas": {"H100": {"nominal": 1, "borrowingLimit": 0}}},
            {"name": "b", "quotas": {"H100": {"nominal": 0}}},
        ]})
        await b.start_allocator(cycle_interval=0.1)
        nc = await connect(b.url, name="tenants")
        seen = await statuses(nc)
        js = nc.jetstream()
        await publish_json(js, subjects.submit("a"), claim("small", "a"), msg_id="small")
        await publish_json(js, subjects.submit("a"), claim("second", "a"), msg_id="second")
        await seen.wait_for(lambda: ("a", "second") in seen.latest())
        waiting = seen.latest()[("a", "second")]
        assert waiting["state"] == "Pending" and "borrowingLimit of 0" in waiting["reason"]

        await set_quotas(b.engine, {"kind": "Quotas", "tenants": [  # an admin raises the quota
            {"name": "a", "quotas": {"H100": {"nominal": 8}}},
            {"name": "b", "quotas": {"H100": {"nominal": 0}}},
        ]})
        await seen.wait_for(lambda: seen.latest()[("a", "second")]["state"] == "Allocated")

        for i in range(8):  # fill the 10 H100s (h1, h2 and the fixture's n1) with low-priority work
            await publish_json(js, subjects.submit("a"), claim(f"low{i}", "a"), msg_id=f"low{i}")
        await seen.wait_for(lambda: all(("a", f"low{i}") in seen.latest() for i in range(8)))
        await publish_json(js, subjects.submit("a"), claim("urgent", "a", priority=9), msg_id="urgent")
        await seen.wait_for(lambda: seen.latest().get(("a", "urgent"), {}).get("state") == "Allocated")
        preempted = [s for _, s in seen.messages if s["state"] == "Preempted"]
        assert len(preempted) == 1 and preempted[0]["by"] == "a/urgent"
        victim = preempted[0]["name"]
        assert [s["state"] for s in seen.for_claim("a", victim)][1:3] == ["Preempted", "Pending"]
        # the next cycle decides the victim like any waiting claim and says why it waits
        await seen.wait_for(lambda: "Insufficient" in (seen.latest()[("a", victim)]["reason"] or ""))
        async with sessions(b.engine)() as session:
            history = list(await session.scalars(select(ClaimEvent.state).join(Claim, Claim.id == ClaimEvent.claim_id)
                                                  .where(Claim.name == victim).order_by(ClaimEvent.sequence)))
            explain = await session.scalar(select(Claim.explain).where(Claim.name == victim))
        assert history == ["Allocated", "Preempted", "Pending", "Pending"]
        assert explain is not None and explain["capacity"][0]["free"] == 0
        await nc.close()
        await watcher.close()


async def test_a_lost_node_sends_its_claims_back_to_pending(
    nats_server: EmbeddedNats, db_url: str, tmp_path: Path
) -> None:
    async with broker(nats_server, db_url, tmp_path) as b:
        watcher, publisher = await use_fleet(b.url, b.inventory)
        await b.start_allocator(cycle_interval=0.1)
        nc = await connect(b.url, name="tenants")
        seen = await statuses(nc)
        await publish_json(nc.jetstream(), subjects.submit("t"), claim("big", "t", count=4), msg_id="big")
        await seen.wait_for(lambda: seen.latest().get(("t", "big"), {}).get("state") == "Allocated")
        lost = seen.latest()[("t", "big")]["allocation"]["nodeName"]
        survivor = "h2" if lost == "h1" else "h1"
        b.inventory.write_text(FLEET.replace(f"  - {{name: {lost}, gpuModel: H100, gpuCount: 4}}\n", ""))
        await publisher.publish_once()  # the node is gone: removed: true
        await seen.wait_for(lambda: any(s["state"] == "Pending" and f"node {lost} was lost" in (s["reason"] or "")
                                        for s in seen.for_claim("t", "big")))
        await seen.wait_for(lambda: seen.latest()[("t", "big")]["state"] == "Allocated")
        assert seen.latest()[("t", "big")]["allocation"]["nodeName"] == survivor
        await watcher.close()
        await nc.close()


class FailsOnceAfterANodeIsLost(Allocator):
    """Its first cycle that sends a lost node's claims back does the work, then its transaction fails
    (as when a racing allocator committed first), so all of it rolls back."""

    failed = False

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.run_cycle = self.cycle.run
        self.cycle.run = self.run_then_fail_once

    async def run_then_fail_once(self, work: Any, config: Any = None, parts: Any = None) -> Any:
        cycled = await self.run_cycle(work, config, parts)
        if cycled.lost and not FailsOnceAfterANodeIsLost.failed:
            FailsOnceAfterANodeIsLost.failed = True
            raise IntegrityError("a cycle", {}, Exception("simulated: a racing allocator committed first"))
        return cycled


async def test_a_lost_node_is_handled_again_when_the_cycle_that_handled_it_rolls_back(
    nats_server: EmbeddedNats, db_url: str, tmp_path: Path
) -> None:
    async with broker(nats_server, db_url, tmp_path) as b:
        FailsOnceAfterANodeIsLost.failed = False
        watcher, publisher = await use_fleet(b.url, b.inventory)
        await b.start_allocator(FailsOnceAfterANodeIsLost, cycle_interval=0.1)
        nc = await connect(b.url, name="tenants")
        seen = await statuses(nc)
        await publish_json(nc.jetstream(), subjects.submit("t"), claim("big", "t", count=4), msg_id="big")
        await seen.wait_for(lambda: seen.latest().get(("t", "big"), {}).get("state") == "Allocated")
        lost = seen.latest()[("t", "big")]["allocation"]["nodeName"]
        b.inventory.write_text(FLEET.replace(f"  - {{name: {lost}, gpuModel: H100, gpuCount: 4}}\n", ""))
        await publisher.publish_once()  # the node is gone: removed: true
        await seen.wait_for(lambda: (seen.latest()[("t", "big")]["allocation"] or {}).get("nodeName")
                            not in (None, lost))
        assert FailsOnceAfterANodeIsLost.failed
        assert [s["state"] for s in seen.for_claim("t", "big")] == ["Allocated", "Pending", "Allocated"]
        await watcher.close()
        await nc.close()
