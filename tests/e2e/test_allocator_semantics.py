"""Exactly-once effects against a real nats-server and real databases: duplicates, redelivery after a
crash between commit and ack, restarts, and bad input that must not stop the allocator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from services.allocator.app import allocator_app
from services.allocator.service import Allocator
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.bus.streams import ensure_streams
from services.watcher.files import FileWatcher
from shared.contract import subjects
from shared.dra.classes import BUILTIN_CLASSES
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import Claim, DeviceAllocation, InboxMessage
from tests.builders import a_claim
from tests.e2e.helpers import Collector, alerts, statuses

pytestmark = pytest.mark.e2e

SLICE = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1-gpu.nvidia.com}
spec:
  driver: gpu.nvidia.com
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    attributes:
      type: {string: gpu}
      productName: {string: NVIDIA H100 80GB HBM3}
    capacity: {memory: {value: 81559Mi}}
  - name: gpu-1
    attributes:
      type: {string: gpu}
      productName: {string: NVIDIA H100 80GB HBM3}
    capacity: {memory: {value: 81559Mi}}
"""


class Broker:
    """A real nats-server, a migrated ledger, the watcher, and allocators we can start and kill."""

    def __init__(self, url: str, db_url: str, inventory: Path) -> None:
        self.url = url
        self.db_url = db_url
        self.inventory = inventory
        self.engine = create_engine(db_url)
        self.tasks: dict[Allocator, asyncio.Task[Any]] = {}

    async def start_allocator(self, cls: type[Allocator] = Allocator, **options: Any) -> Allocator:
        allocator = cls(self.engine, BUILTIN_CLASSES, **options)
        self.tasks[allocator] = asyncio.create_task(allocator_app(self.url, allocator).run())
        assert await allocator.wait_for_inventory(20)
        return allocator

    async def stop(self, allocator: Allocator) -> None:
        allocator.stop()
        task = self.tasks.pop(allocator)
        done, _ = await asyncio.wait({task}, timeout=20)
        assert done, "the allocator did not stop within 20 s"
        if not task.cancelled() and (error := task.exception()) is not None:  # a crash a test made is a cancel
            raise error

    async def count(self, model: Any, *where: Any) -> int:
        async with sessions(self.engine)() as session:
            return int(await session.scalar(select(func.count()).select_from(model).where(*where)) or 0)


@contextlib.asynccontextmanager
async def broker(nats_server: EmbeddedNats, db_url: str, tmp_path: Path) -> AsyncIterator[Broker]:
    inventory = tmp_path / "slices.yaml"
    inventory.write_text(SLICE)
    await migrate(db_url)
    b = Broker(nats_server.url, db_url, inventory)
    nc = await connect(nats_server.url, name="watcher")
    await ensure_streams(nc.jetstream())
    await FileWatcher(nc.jetstream(), [inventory]).publish_once()
    try:
        yield b
    finally:
        for allocator in list(b.tasks):
            await b.stop(allocator)
        await nc.close()
        await b.engine.dispose()


def claim(name: str, tenant: str = "team", **metadata: Any) -> dict[str, Any]:
    document = a_claim(name, tenant).request().document()
    document["metadata"].update(metadata)
    return document


async def submit(nc: Any, document: dict[str, Any], msg_id: str, tenant: str = "team") -> Any:
    return await publish_json(nc.jetstream(), subjects.submit(tenant), document, msg_id=msg_id)


async def test_duplicate_submissions_change_nothing(nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path) -> None:
    async with broker(nats_server, ledger_url, tmp_path) as b:
        await b.start_allocator()
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        first = await submit(nc, claim("a"), "id-a")
        # The same Nats-Msg-Id: JetStream drops it inside its 100 ms window, the inbox after it.
        await submit(nc, claim("a"), "id-a")
        assert first.duplicate is None
        await submit(nc, claim("a"), "id-a-resent-by-hand")  # a new id for the same claim: no effect
        await submit(nc, claim("sentinel"), "id-sentinel")
        await seen.wait_for(lambda: ("team", "sentinel") in seen.latest())
        assert [s["sequence"] for s in seen.for_claim("team", "a")] == [1]
        assert await b.count(DeviceAllocation) == 2
        await nc.close()


async def until_acked(nc: Any, timeout: float = 20.0) -> None:
    """Wait for the allocator's consumer to have nothing unacknowledged (the redelivery was handled)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        info = await nc.jetstream().consumer_info(subjects.CLAIMS_STREAM, "allocator")
        if info.num_ack_pending == 0 and info.num_pending == 0:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"consumer still has {info.num_ack_pending} unacknowledged message(s)")
        await asyncio.sleep(0.05)


class CrashAfterCommit(Allocator):
    """Dies after its transaction commits and before it acks the message."""

    crashed = asyncio.Event()

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.intake.take = self.decide_and_crash  # each fetched batch

    async def decide_and_crash(self, messages: Any) -> None:
        await self.transaction.decide(messages)
        if messages:
            type(self).crashed.set()
            raise asyncio.CancelledError


async def test_redelivery_after_crash_between_commit_and_ack(
    nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path
) -> None:
    async with broker(nats_server, ledger_url, tmp_path) as b:
        CrashAfterCommit.crashed = asyncio.Event()
        doomed = await b.start_allocator(CrashAfterCommit, ack_wait=1.0)
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        await submit(nc, claim("a"), "id-a")
        await asyncio.wait_for(CrashAfterCommit.crashed.wait(), 20)
        await b.stop(doomed)
        assert await b.count(DeviceAllocation) == 1  # committed, never acked, never published

        await b.start_allocator(ack_wait=1.0)  # publishes the outbox, then gets the redelivery
        await until_acked(nc)
        await submit(nc, claim("sentinel"), "id-sentinel")
        await seen.wait_for(lambda: ("team", "sentinel") in seen.latest())
        assert [s["sequence"] for s in seen.for_claim("team", "a")] == [1]
        assert seen.latest()[("team", "a")]["state"] == "Allocated"
        assert await b.count(DeviceAllocation) == 2
        assert await b.count(InboxMessage, InboxMessage.message_id == "id-a") == 1
        consumer = await nc.jetstream().consumer_info(subjects.CLAIMS_STREAM, "allocator")
        assert consumer.num_ack_pending == 0 and consumer.num_pending == 0
        assert consumer.num_redelivered == 0  # nothing left in redelivery: the crashed message was acked
        await nc.close()


async def test_restart_rebuilds_state_from_ledger(nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path) -> None:
    async with broker(nats_server, ledger_url, tmp_path) as b:
        first = await b.start_allocator()
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        await submit(nc, claim("a"), "id-a")
        await submit(nc, claim("b"), "id-b")
        await seen.wait_for(lambda: len(seen.latest()) == 2)
        await b.stop(first)

        await b.start_allocator()
        await submit(nc, claim("c"), "id-c")
        await seen.wait_for(lambda: ("team", "c") in seen.latest())
        assert seen.latest()[("team", "c")]["state"] == "Pending"
        reason = seen.latest()[("team", "c")]["reason"]
        assert reason == "Insufficient nvidia.com/gpu: requested 1, free 0 of 2 on 1 node"
        await publish_json(nc.jetstream(), subjects.release("team"), {"name": "a"}, msg_id="rel-a")
        await seen.wait_for(lambda: seen.latest()[("team", "c")]["state"] == "Allocated")
        await nc.close()


async def test_malformed_payload_is_reported_and_the_allocator_keeps_serving(
    nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path
) -> None:
    async with broker(nats_server, ledger_url, tmp_path) as b:
        await b.start_allocator()
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        alarms: Collector = await alerts(nc)
        await nc.jetstream().publish(subjects.submit("team"), b"{not json", headers={"Nats-Msg-Id": "junk"})
        broken = claim("broken")
        broken["spec"]["devices"]["requests"][0]["exactly"]["count"] = "many"
        await submit(nc, broken, "id-broken")
        await submit(nc, claim("good"), "id-good")
        await seen.wait_for(lambda: ("team", "good") in seen.latest())
        await alarms.wait_for(lambda: len(alarms.messages) >= 1)
        subject, alert = alarms.messages[0]
        assert subject == "claimbroker.v1.alerts.warning.invalid-message.team" and alert["tenant"] == "team"
        assert alert["kind"] == "invalid-message" and "not JSON" in alert["summary"]
        rejected = seen.latest()[("team", "broken")]
        assert rejected["state"] == "Rejected"
        assert "count" in rejected["reason"]
        assert seen.latest()[("team", "good")]["state"] == "Allocated"
        await nc.close()


async def test_namespace_must_match_the_subject_tenant(
    nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path
) -> None:
    async with broker(nats_server, ledger_url, tmp_path) as b:
        await b.start_allocator()
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        await submit(nc, claim("sneaky", tenant="other"), "id-sneaky", tenant="team")
        await seen.wait_for(lambda: ("team", "sneaky") in seen.latest())
        refused = seen.latest()[("team", "sneaky")]
        assert refused["state"] == "Rejected"
        assert "does not match the subject's tenant 'team'" in refused["reason"]
        assert await b.count(DeviceAllocation) == 0
        assert await b.count(Claim, Claim.namespace == "other") == 0
        await nc.close()


class DiesHoldingItsBatch(Allocator):
    """Fetches a batch and dies before deciding it, as a process killed with SIGKILL would."""

    holding = asyncio.Event()

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.intake.take = self.hold_forever  # each fetched batch

    async def hold_forever(self, messages: Any) -> None:
        if messages:
            type(self).holding.set()
            await asyncio.Event().wait()  # never decides; its task is cancelled like a killed process


async def test_what_a_killed_allocator_held_is_decided_within_seconds(
    nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path
) -> None:
    """A restarted or standby allocator gets the dead one's batch after ack_wait (the allocator's own: the
    durable consumer, made with 30 s by an older allocator, is brought to it), not after 30 s."""
    async with broker(nats_server, ledger_url, tmp_path) as b:
        older = await b.start_allocator(ack_wait=30.0)
        await b.stop(older)
        DiesHoldingItsBatch.holding = asyncio.Event()
        doomed = await b.start_allocator(DiesHoldingItsBatch, ack_wait=2.0)
        nc = await connect(b.url, name="tenant")
        info = await nc.jetstream().consumer_info(subjects.CLAIMS_STREAM, "allocator")
        assert info.config.ack_wait == 2.0
        seen = await statuses(nc)
        await submit(nc, claim("a"), "id-a")
        await asyncio.wait_for(DiesHoldingItsBatch.holding.wait(), 20)
        killed_at = asyncio.get_running_loop().time()
        b.tasks.pop(doomed).cancel()
        await doomed.nc.close()

        await b.start_allocator(ack_wait=2.0)
        await seen.wait_for(lambda: ("team", "a") in seen.latest(), timeout=15)
        assert asyncio.get_running_loop().time() - killed_at < 2.0 + 3.0  # ack_wait, and a start
        assert [s["state"] for s in seen.for_claim("team", "a")] == ["Allocated"]


class SlowCommit(Allocator):
    """Takes three ack_waits to decide its first batch: marking it in progress keeps it its own."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.decide = self.transaction.decide
        self.transaction.decide = self.decide_slowly

    async def decide_slowly(self, messages: Any) -> None:
        if messages:
            await asyncio.sleep(3 * self.ack_wait)
        await self.decide(messages)


async def test_a_slow_batch_is_not_redelivered_while_it_is_decided(
    nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path
) -> None:
    async with broker(nats_server, ledger_url, tmp_path) as b:
        await b.start_allocator(SlowCommit, ack_wait=1.0)
        nc = await connect(b.url, name="tenant")
        await submit(nc, claim("a"), "id-a")
        await until_acked(nc)
        info = await nc.jetstream().consumer_info(subjects.CLAIMS_STREAM, "allocator")
        assert info.num_redelivered == 0


async def test_a_claim_with_an_integer_beyond_64_bits_is_rejected(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """JSON allows any integer, Kubernetes' fields stop at int64 (a toleration's seconds): such a claim is
    Rejected at once with the field named, not dead-lettered after a ledger that could not store it."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    async with broker(nats_server, db_url, tmp_path) as b:
        await b.start_allocator()
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        document = claim("huge-seconds")
        document["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
            {"key": "maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2**70}]
        await submit(nc, document, "id-huge-seconds")
        await seen.wait_for(lambda: ("team", "huge-seconds") in seen.latest(), timeout=20)
        status = seen.latest()[("team", "huge-seconds")]
        assert status["state"] == "Rejected" and "outside the 64-bit integer range" in status["reason"], status
        await nc.close()
