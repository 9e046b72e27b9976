"""The notifier's periodic usage pass against a real nats-server and ledger (SQLite and PostgreSQL):
quotas, claims and device allocations written straight into the ledger, inventory published on its
subject, one pass driven by calling `check_usage` (the fake clock never makes the loop's own pass due)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from sqlalchemy import delete, select, update

from services.bus.cancel import wait_closed
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.bus.streams import ensure_streams
from services.notifier.app import notifier_app
from services.notifier.service import Notifier
from shared.admission.quota import parse_quotas
from shared.alerts.book import Message
from shared.alerts.rules import MigAdviceRule
from shared.contract import events, subjects
from shared.dra import model as dra
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.quota_store import apply_quota_config
from shared.ledger.schema import AlertRecord, Claim, DeviceAllocation, UsageSample
from shared.settings import BrokerSettings
from tests.builders import a_claim
from tests.e2e.helpers import T0, Collector, FakeClock, alerts

pytestmark = pytest.mark.e2e
PRODUCTS = {"H100": "NVIDIA H100 80GB HBM3", "B200": "NVIDIA B200"}



@dataclass
class Harness:
    notifier: Notifier
    clock: FakeClock
    nc: Client
    alarms: Collector
    factory: Any
    published: int = 0

    async def quotas(self, *tenants: dict[str, Any]) -> None:
        async with self.factory() as session, session.begin():
            await apply_quota_config(session, parse_quotas({"kind": "Quotas", "tenants": list(tenants)}), "test")

    async def claim(self, tenant: str, name: str, state: str, *, explain: dict[str, Any] | None = None,
                    devices: int = 0, flavor: str = "H100", node: str = "n1") -> int:
        async with self.factory() as session, session.begin():
            row = Claim(namespace=tenant, name=name, state=state, spec={}, explain=explain)
            session.add(row)
            await session.flush()
            for index in range(devices):
                session.add(DeviceAllocation(driver="gpu.nvidia.com", pool=node, device=f"{name}-{index}",
                                             claim_id=row.id, node=node, request="gpu", flavor=flavor))
            return row.id

    async def inventory(self, node: str, model: str, count: int) -> None:
        devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"},
                                                        "productName": {"string": PRODUCTS[model]}}}
                   for i in range(count)]
        piece = dra.parse_object({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}})
        assert isinstance(piece, dra.ResourceSlice)
        payload = events.inventory_payload(node, [piece], labels={}, sequence=self.published,
                                           observed_at=self.clock.now)
        await publish_json(self.nc.jetstream(), subjects.inventory(node), payload)
        self.published += 1
        await self.notifier.wait_handled(self.published)

    def seen(self, kind: str) -> list[tuple[str, int, bool]]:
        return [(a["key"], a["count"], a["resolved"]) for _, a in self.alarms.messages if a["kind"] == kind]

    async def wait_seen(self, kind: str, items: list[tuple[str, int, bool]]) -> None:
        await self.alarms.wait_for(lambda: self.seen(kind) == items)

    async def stored(self, kind: str) -> list[tuple[str, int, bool]]:
        async with self.factory() as session:
            rows = await session.scalars(select(AlertRecord).where(AlertRecord.kind == kind))
            return sorted((r.key, r.count, r.resolved) for r in rows)


def keys(sent: list[Message]) -> list[tuple[str, bool]]:
    return [(m.alert.key, m.resolved) for m in sent]


Start = Callable[[], Awaitable[Harness]]


@pytest.fixture
async def start(nats_server: EmbeddedNats, db_url: str, tmp_path: Path) -> AsyncIterator[Start]:
    await migrate(db_url)
    engine = create_engine(db_url)
    nc = await connect(nats_server.url, name="test")
    await ensure_streams(nc.jetstream())
    tasks: list[asyncio.Task[None]] = []

    async def _start() -> Harness:
        settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data", usage_check_interval=30.0)
        clock = FakeClock()  # advanced only by tests: the loop's own next pass is due at T0 + 30
        notifier = Notifier(engine, settings.notifier, clock=clock, check_interval=0.05)
        tasks.append(asyncio.create_task(notifier_app(nats_server.url, notifier).run()))
        await asyncio.wait_for(notifier.ready.wait(), 20)
        assert notifier.usage_checks == 1  # the pass at start, before ready
        return Harness(notifier, clock, nc, await alerts(nc), sessions(engine))

    yield _start
    for task in tasks:
        await wait_closed(task)
    await nc.close()
    await engine.dispose()


async def test_quota_near_limit_fires_once_and_resolves(start: Start) -> None:
    h = await start()
    await h.quotas({"name": "vision", "quotas": {"H100": {"nominal": 10}, "B200": {"nominal": 4}}},
                   {"name": "speech", "quotas": {"H100": {"nominal": 10}}})
    await h.claim("vision", "train", "Allocated", devices=7)
    small = await h.claim("vision", "eval", "Allocated", devices=2)
    await h.claim("speech", "asr", "Allocated", devices=3)  # 3 of 10: quiet

    assert keys(await h.notifier.check_usage()) == [("quota-near-limit:vision/H100", False)]
    assert keys(await h.notifier.check_usage()) == []  # still 9 of 10: the same episode, not a repeat
    await h.wait_seen("quota-near-limit", [("quota-near-limit:vision/H100", 1, False)])
    (message,) = [a for _, a in h.alarms.messages]
    assert message["details"]["used"] == 9 and message["details"]["limit"] == 10
    assert message["labels"] == {"tenant": "vision", "flavor": "H100"}

    async with h.factory() as session, session.begin():
        await session.execute(delete(DeviceAllocation).where(DeviceAllocation.claim_id == small))
    assert keys(await h.notifier.check_usage()) == [("quota-near-limit:vision/H100", True)]
    await h.wait_seen("quota-near-limit", [("quota-near-limit:vision/H100", 1, False),
                                           ("quota-near-limit:vision/H100", 1, True)])
    assert await h.stored("quota-near-limit") == [("quota-near-limit:vision/H100", 1, True)]


async def test_removed_quota_resolves_its_alert(start: Start) -> None:
    h = await start()
    await h.quotas({"name": "vision", "quotas": {"H100": {"nominal": 2}}})
    await h.claim("vision", "train", "Allocated", devices=2)
    assert keys(await h.notifier.check_usage()) == [("quota-near-limit:vision/H100", False)]
    await h.quotas()  # the import that deletes every tenant
    assert keys(await h.notifier.check_usage()) == [("quota-near-limit:vision/H100", True)]


async def test_idle_larger_flavor_fires_while_b200_idles_and_resolves(start: Start) -> None:
    h = await start()
    await h.inventory("b1", "B200", 4)
    await h.inventory("b1", "B200", 4)  # a heartbeat: same slices, not counted twice
    await h.inventory("h1", "H100", 2)
    await h.claim("vision", "busy", "Allocated", devices=2, flavor="H100", node="h1")
    await h.claim("vision", "busy-b", "Allocated", devices=1, flavor="B200", node="b1")
    await h.claim("vision", "wait", "Pending", explain={"flavors": ["H100"]})
    # Accepts both: counted once, towards the cheaper one (H100), so H100 has two claims waiting.
    await h.claim("vision", "either", "Pending", explain={"flavors": ["B200", "H100"]})

    assert keys(await h.notifier.check_usage()) == [("idle-larger-flavor:H100", False)]
    await h.wait_seen("idle-larger-flavor", [("idle-larger-flavor:H100", 1, False)])
    (message,) = [a for _, a in h.alarms.messages]
    assert message["details"]["idle"] == {"B200": 3} and message["details"]["waiting"] == 2
    assert keys(await h.notifier.check_usage()) == []

    async with h.factory() as session, session.begin():
        await session.execute(update(Claim).where(Claim.namespace == "vision", Claim.state == "Pending")
                              .values(state="Allocated", explain=None))
    assert keys(await h.notifier.check_usage()) == [("idle-larger-flavor:H100", True)]
    await h.wait_seen("idle-larger-flavor", [("idle-larger-flavor:H100", 1, False),
                                             ("idle-larger-flavor:H100", 1, True)])


async def test_a_stale_nodes_devices_are_not_idle_capacity(start: Start) -> None:
    """Devices on a node not heard of within the inventory TTL take no claim: idle-larger-flavor does not
    point at them (shared/fleet/freshness.py, as the allocator and the API judge the node)."""
    h = await start()
    await h.inventory("b1", "B200", 4)
    await h.inventory("h1", "H100", 2)
    await h.claim("vision", "busy", "Allocated", devices=2, flavor="H100", node="h1")
    await h.claim("vision", "wait", "Pending", explain={"flavors": ["H100"]})
    h.clock.now = T0 + float(h.notifier.settings.inventory_ttl) + 1  # neither node heard of since T0
    assert keys(await h.notifier.check_usage()) == []
    h.clock.now = T0
    assert keys(await h.notifier.check_usage()) == [("idle-larger-flavor:H100", False)]


async def test_each_minute_s_usage_is_sampled_once_for_the_fleet_over_time(start: Start) -> None:
    h = await start()
    await h.inventory("h1", "H100", 4)
    await h.quotas({"name": "vision", "quotas": {"H100": {"nominal": 1}}}, {"name": "speech", "quotas": {}})
    await h.claim("vision", "train", "Allocated", devices=3, node="h1")
    h.clock.now = T0 + 60
    await h.notifier.check_usage()
    await h.claim("speech", "asr", "Allocated", devices=1, node="h1")
    await h.notifier.check_usage()  # the same minute: already sampled, nothing written
    async with h.factory() as session:
        rows = sorted((r.at, r.tenant, r.flavor, r.used, r.nominal, r.capacity)
                      for r in await session.scalars(select(UsageSample).where(UsageSample.at == T0 + 60)))
    assert rows == [(T0 + 60, "", "H100", 0, 0, 4), (T0 + 60, "vision", "H100", 3, 1, 0)]
    h.clock.now = T0 + 120
    await h.inventory("h1", "H100", 4)  # its heartbeat: heard of within the TTL, its devices still count
    await h.notifier.check_usage()
    async with h.factory() as session:
        later = {(r.tenant, r.used) for r in await session.scalars(select(UsageSample).where(
            UsageSample.at == T0 + 120))}
    assert later == {("", 0), ("vision", 3), ("speech", 1)}


async def test_no_idle_alert_when_the_larger_flavor_is_all_allocated(start: Start) -> None:
    h = await start()
    await h.inventory("b1", "B200", 1)
    await h.claim("vision", "busy-b", "Allocated", devices=1, flavor="B200", node="b1")
    await h.claim("vision", "wait", "Pending", explain={"flavors": ["H100"]})
    assert keys(await h.notifier.check_usage()) == []


async def test_the_loop_checks_every_usage_check_interval(start: Start) -> None:
    h = await start()
    await h.quotas({"name": "vision", "quotas": {"H100": {"nominal": 1}}})
    await h.claim("vision", "train", "Allocated", devices=1)
    h.clock.now += 30  # due now: the loop's next round runs the pass without being called
    await h.notifier.wait_usage_checks(2)
    await h.wait_seen("quota-near-limit", [("quota-near-limit:vision/H100", 1, False)])


async def test_mig_relayout_suggested_while_slices_wait_and_an_idle_gpu_could_carve_them(start: Start) -> None:
    h = await start()
    h.notifier.mig_advice = MigAdviceRule(minimum=1, window=0)  # at the first plan, for the test
    await h.inventory("m", "H100", 2)  # two whole H100s, idle
    assert keys(await h.notifier.check_usage()) == []  # nothing waits for a slice: no plan is made
    profile = 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    async with h.factory() as session, session.begin():
        session.add(Claim(namespace="lab", name="slice", state="Pending", sequence=1,
                          spec=a_claim("slice", "lab").request(cls="mig.nvidia.com", selectors=(profile,)).document()))
    assert keys(await h.notifier.check_usage()) == [("mig-relayout-suggested:", False)]
    await h.alarms.wait_for(lambda: bool(h.seen("mig-relayout-suggested")))
    (message,) = [a for _, a in h.alarms.messages if a["kind"] == "mig-relayout-suggested"]
    assert message["details"]["gained"] == 1 and message["details"]["layouts"][0]["node"] == "m"
    async with h.factory() as session, session.begin():
        (await session.scalar(select(Claim).where(Claim.name == "slice"))).state = "Released"  # type: ignore[union-attr]
    assert keys(await h.notifier.check_usage()) == [("mig-relayout-suggested:", True)]
