"""The notifier against a real nats-server and ledger (SQLite and PostgreSQL), driven by statuses and
inventory published straight on the subjects, with a fake clock: every wired alert kind fires once for its
condition, repeats fold into one later count, resolves follow; webhooks retry and dead-letter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from sqlalchemy import select

from services.bus.cancel import wait_closed
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from services.bus.streams import ensure_streams
from services.notifier.app import notifier_app
from services.notifier.service import Notifier
from shared.alerts.rules import QuotaUsage
from shared.contract import events, subjects
from shared.contract.gang_reasons import incomplete_reason
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import AlertRecord, Claim, Tenant, WebhookDeadLetter
from shared.settings import BrokerSettings
from tests.e2e.helpers import Collector, FakeClock, alerts

pytestmark = pytest.mark.e2e



@dataclass
class Harness:
    notifier: Notifier
    clock: FakeClock
    nc: Client
    alarms: Collector
    factory: Any
    task: asyncio.Task[None] | None = None
    sent: int = 0
    _ids: dict[str, int] = field(default_factory=dict)

    async def status(self, tenant: str, name: str, state: str, **extra: Any) -> None:
        sequence = self._ids[f"{tenant}/{name}"] = self._ids.get(f"{tenant}/{name}", 0) + 1
        payload = events.claim_status(namespace=tenant, name=name, state=state, allocation=None,
                                      reason=f"{state.lower()} because", sequence=sequence) | extra
        await publish_json(self.nc.jetstream(), subjects.status(tenant, name), payload)
        await self._processed()

    async def inventory(self, node: str, *, removed: bool = False, **health: str) -> None:
        devices = {d: {"health": h, "temperatureC": 88, "throttleReasons": ["HwThermalSlowdown"] if
                       h == "Throttled" else [], "eccUncorrected": 3 if h == "Unhealthy" else 0}
                   for d, h in health.items()}
        payload = events.inventory_payload(node, [], labels={}, sequence=self.sent, observed_at=self.clock.now,
                                           telemetry={"devices": devices} if devices else None, removed=removed)
        await publish_json(self.nc.jetstream(), subjects.inventory(node), payload)
        await self._processed()

    async def _processed(self) -> None:
        self.sent += 1
        await self.notifier.wait_handled(self.sent)

    async def stop(self) -> None:
        """As a process exit would: the task ends and its connection closes (its pull request goes too)."""
        if self.task is not None:
            await wait_closed(self.task)
        await self.notifier.nc.close()

    async def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        await self.notifier.tick()

    def seen(self, kind: str | None = None) -> list[tuple[str, int, bool]]:
        return [(a["key"], a["count"], a["resolved"]) for _, a in self.alarms.messages
                if kind is None or a["kind"] == kind]

    async def wait_seen(self, item: tuple[str, int, bool]) -> None:
        await self.alarms.wait_for(lambda: item in self.seen())


Start = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def start(nats_server: EmbeddedNats, ledger_url: str, tmp_path: Path) -> AsyncIterator[Start]:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    nc = await connect(nats_server.url, name="test")
    await ensure_streams(nc.jetstream())
    tasks: list[asyncio.Task[None]] = []

    async def _start(**overrides: Any) -> Harness:
        settings = BrokerSettings(nats_url=nats_server.url, data_dir=tmp_path / "data",
                                  **{"pending_alert_after": 600, "inventory_ttl": 90, **overrides})
        clock = FakeClock()
        notifier = Notifier(engine, settings.notifier, clock=clock)
        task = asyncio.create_task(notifier_app(nats_server.url, notifier).run())
        tasks.append(task)
        await asyncio.wait_for(notifier.ready.wait(), 20)
        return Harness(notifier, clock, nc, await alerts(nc), sessions(engine), task)

    yield _start
    for task in tasks:
        await wait_closed(task)
    await nc.close()
    await engine.dispose()


async def test_claim_alerts_fire_fold_and_resolve(start: Start) -> None:
    h = await start()
    for _ in range(3):
        await h.status("vision", "typo", "Rejected")
    assert h.seen() == [("claim-rejected:vision/typo", 1, False)]  # the repeats are only counted
    await h.advance(299)
    assert h.seen() == [("claim-rejected:vision/typo", 1, False)]
    await h.advance(1)  # the fold window closes: one message with the total
    await h.wait_seen(("claim-rejected:vision/typo", 3, False))
    await h.status("vision", "typo", "Released")
    await h.wait_seen(("claim-rejected:vision/typo", 3, True))

    await h.status("vision", "huge", "Pending", unsatisfiable=True)
    await h.wait_seen(("claim-unsatisfiable:vision/huge", 1, False))
    await h.status("vision", "huge", "Pending", unsatisfiable=False)
    await h.wait_seen(("claim-unsatisfiable:vision/huge", 1, True))

    await h.status("speech", "low", "Preempted", by="vision/urgent")
    await h.wait_seen(("claim-preempted:speech/low", 1, False))
    await h.status("speech", "low", "Allocated")
    await h.wait_seen(("claim-preempted:speech/low", 1, True))

    await h.advance(600)  # huge has waited 600s
    await h.wait_seen(("claim-pending-too-long:vision/huge", 1, False))
    await h.status("vision", "huge", "Allocated")
    await h.wait_seen(("claim-pending-too-long:vision/huge", 1, True))

    by_key: dict[str, tuple[str, dict[str, Any]]] = {}
    for subject_seen, alert in h.alarms.messages:
        by_key.setdefault(alert["key"], (subject_seen, alert))  # each key's first message
    subject, preempted = by_key["claim-preempted:speech/low"]
    assert subject == "claimbroker.v1.alerts.warning.claim-preempted.speech" and preempted["tenant"] == "speech"
    assert preempted["labels"] == {"tenant": "speech", "claim": "low"}
    assert preempted["details"]["by"] == "vision/urgent" and "by vision/urgent" in preempted["summary"]
    assert by_key["claim-unsatisfiable:vision/huge"][0] == "claimbroker.v1.alerts.critical.claim-unsatisfiable.vision"
    assert len(h.alarms.messages) == 9  # nothing else, nothing twice

    async with h.factory() as s:  # the history: one row per episode, holding its last message
        rows = {r.key: r for r in await s.scalars(select(AlertRecord))}
    rejected = rows["claim-rejected:vision/typo"]
    assert (rejected.count, rejected.resolved, rejected.tenant) == (3, True, "vision")
    assert rejected.resolved_at is not None and rejected.details["reason"] == "rejected because"
    assert len(rows) == 4 and all(r.resolved for r in rows.values())


async def test_pending_threshold_per_tenant_from_the_ledger(start: Start, ledger_url: str) -> None:
    h = await start()
    async with h.factory() as s, s.begin():
        s.add(Tenant(name="fast", pending_alert_after_s=60.0))
    await h.advance(30)  # past the tenant refresh: the notifier reads the new threshold
    await h.status("fast", "a", "Pending")
    await h.status("slow", "b", "Pending")
    await h.advance(60)
    await h.wait_seen(("claim-pending-too-long:fast/a", 1, False))
    assert h.seen("claim-pending-too-long") == [("claim-pending-too-long:fast/a", 1, False)]
    await h.advance(540)
    await h.wait_seen(("claim-pending-too-long:slow/b", 1, False))


async def test_an_incomplete_gang_raises_one_alert_not_one_per_member(start: Start) -> None:
    """A gang of 2 with 1 member past the threshold: one gang-incomplete on the tenant's warning subject, no
    claim-pending-too-long for the member, and the second member's arrival (both Allocated) resolves it."""
    h = await start(pending_alert_after=60)
    await h.status("ml", "rank-0", "Pending", reason=incomplete_reason("train-7", 1, 2))
    h.clock.now += 59
    assert await h.notifier.tick() == []
    h.clock.now += 1
    [raised] = await h.notifier.tick()
    assert raised.alert.key == "gang-incomplete:ml/train-7"
    h.clock.now += 600  # long past the member's own threshold too
    assert await h.notifier.tick() == []
    await h.status("ml", "rank-1", "Allocated")
    await h.status("ml", "rank-0", "Allocated")
    await h.wait_seen(("gang-incomplete:ml/train-7", 1, True))
    assert h.seen() == [("gang-incomplete:ml/train-7", 1, False), ("gang-incomplete:ml/train-7", 1, True)]
    subject, alert = h.alarms.messages[0]
    assert subject == "claimbroker.v1.alerts.warning.gang-incomplete.ml"
    assert alert["summary"] == ("gang train-7 of tenant ml: 1 of 2 members received for 60s (threshold 60s); "
                                "missing 1 member")
    assert alert["labels"] == {"tenant": "ml", "gang": "train-7"} and alert["tenant"] == "ml"
    assert (alert["details"]["received"], alert["details"]["size"], alert["details"]["missing"]) == (1, 2, 1)
    assert h.alarms.messages[1][1]["summary"] == "gang train-7 of tenant ml is complete: member rank-0 is Allocated"


async def test_a_restart_keeps_a_waiting_gangs_alert_and_resolves_one_that_stopped_waiting(start: Start) -> None:
    """The ledger says which gangs still wait for members: train-7's member does (its alert stays open, not
    raised again, and resolves when the gang completes); eval-2's members were decided while the notifier
    was away (its alert is resolved at the first tick)."""
    first = await start(pending_alert_after=60)
    waiting = incomplete_reason("train-7", 1, 2)
    await first.status("ml", "rank-0", "Pending", reason=waiting)
    await first.status("ml", "eval-0", "Pending", reason=incomplete_reason("eval-2", 1, 2))
    await first.advance(60)
    await first.wait_seen(("gang-incomplete:ml/eval-2", 1, False))
    await first.wait_seen(("gang-incomplete:ml/train-7", 1, False))
    await first.stop()
    async with first.factory() as s, s.begin():  # the ledger as the allocator left it
        s.add(Claim(namespace="ml", name="rank-0", state="Pending", spec={}, reason=waiting))
    second = await start(pending_alert_after=60)
    second.clock.now = first.clock.now + 600
    sent = await second.notifier.tick()
    assert [(m.alert.key, m.resolved) for m in sent] == [("gang-incomplete:ml/eval-2", True)]
    await second.wait_seen(("gang-incomplete:ml/eval-2", 1, True))
    await second.status("ml", "rank-0", "Allocated")
    await second.wait_seen(("gang-incomplete:ml/train-7", 1, True))
    assert second.seen() == [("gang-incomplete:ml/eval-2", 1, True), ("gang-incomplete:ml/train-7", 1, True)]


async def test_inventory_alerts(start: Start) -> None:
    h = await start()
    await h.inventory("n1", gpu0="Healthy", gpu1="Healthy")
    assert h.seen() == []
    await h.inventory("n1", gpu0="Unhealthy", gpu1="Throttled")
    await h.wait_seen(("device-unhealthy:n1/gpu0", 1, False))
    await h.wait_seen(("device-throttled:n1/gpu1", 1, False))
    await h.inventory("n1", gpu0="Unhealthy", gpu1="Throttled")  # a repeat: folded
    await h.inventory("n1", gpu0="Healthy", gpu1="Healthy")
    await h.wait_seen(("device-unhealthy:n1/gpu0", 2, True))
    await h.wait_seen(("device-throttled:n1/gpu1", 2, True))

    await h.advance(90)  # no inventory for the TTL
    await h.wait_seen(("inventory-stale:n1", 1, False))
    await h.inventory("n1")
    await h.wait_seen(("inventory-stale:n1", 1, True))

    await h.inventory("n1", removed=True)
    await h.wait_seen(("node-lost:n1", 1, False))
    await h.inventory("n1")
    await h.wait_seen(("node-lost:n1", 1, True))
    await h.inventory("ghost", removed=True)  # never ours: nothing
    await h.advance(1)

    assert len(h.alarms.messages) == 8
    subjects_seen = {s for s, _ in h.alarms.messages}
    assert subjects_seen == {"claimbroker.v1.alerts.critical.device-unhealthy._fleet",  # about no tenant
                             "claimbroker.v1.alerts.warning.device-throttled._fleet",
                             "claimbroker.v1.alerts.warning.inventory-stale._fleet",
                             "claimbroker.v1.alerts.critical.node-lost._fleet"}
    unhealthy = next(a for _, a in h.alarms.messages if a["kind"] == "device-unhealthy")
    assert unhealthy["labels"] == {"node": "n1", "device": "gpu0"} and unhealthy["details"]["eccUncorrected"] == 3


class Receiver:
    """A webhook receiver on 127.0.0.1 that answers 500 to the first `failures` requests (None: all)."""

    def __init__(self, failures: int | None) -> None:
        self.failures = failures
        self.requests: list[dict[str, Any]] = []
        self.successes = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/hook"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        self.requests.append(json.loads(await reader.readexactly(length)))
        failing = self.failures is None or len(self.requests) <= self.failures
        self.successes += 0 if failing else 1
        status = b"500 Internal Server Error" if failing else b"200 OK"
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_webhook_retried_until_delivered_once_and_dead_lettered_when_it_never_is(start: Start) -> None:
    flaky, broken, slack = Receiver(failures=2), Receiver(failures=None), Receiver(failures=0)
    flaky_url, broken_url, slack_url = await flaky.start(), await broken.start(), await slack.start()
    h = await start(webhooks=[flaky_url, broken_url, f"slack:{slack_url}"], webhook_attempts=4,
                    webhook_base_delay=0.001)
    await h.status("vision", "typo", "Rejected")
    await h.notifier.webhooks.join()

    assert (len(flaky.requests), flaky.successes) == (3, 1)
    assert flaky.requests[-1]["key"] == "claim-rejected:vision/typo" and flaky.requests[-1]["count"] == 1
    assert len(broken.requests) == 4
    assert slack.successes == 1 and set(slack.requests[0]) == {"text", "blocks"}
    assert slack.requests[0]["text"].startswith("[WARNING] claim-rejected: claim vision/typo was rejected")
    async with h.factory() as s:
        letters = list(await s.scalars(select(WebhookDeadLetter)))
    assert [(d.url, d.alert_key, d.attempts) for d in letters] == [(broken_url, "claim-rejected:vision/typo", 4)]
    assert letters[0].last_error.startswith("HTTP 500") and letters[0].payload["kind"] == "claim-rejected"
    for receiver in (flaky, broken, slack):
        await receiver.stop()


async def test_restart_resolves_what_was_open_before(start: Start) -> None:
    first = await start()
    await first.status("vision", "typo", "Rejected")
    await first.wait_seen(("claim-rejected:vision/typo", 1, False))
    await first.stop()
    second = await start()  # a new notifier on the same durable consumer and ledger
    # It re-published the recent history on start (a crash may have kept it from NATS): a duplicate.
    assert (await second.nc.jetstream().stream_info(subjects.ALERTS_STREAM)).state.messages == 1
    await second.status("vision", "typo", "Rejected")  # folds into the open alert
    await second.status("vision", "typo", "Released")
    await second.wait_seen(("claim-rejected:vision/typo", 2, True))
    assert second.seen() == [("claim-rejected:vision/typo", 2, True)]
    assert (await second.nc.jetstream().stream_info(subjects.ALERTS_STREAM)).state.messages == 2


async def test_quota_and_flavor_hooks_publish(start: Start) -> None:
    h = await start()
    await h.notifier.evaluate_quotas([QuotaUsage("vision", "H100", used=9, nominal=8, borrowing_limit=2)])
    await h.wait_seen(("quota-near-limit:vision/H100", 1, False))
    await h.notifier.evaluate_quotas([QuotaUsage("vision", "H100", used=2, nominal=8, borrowing_limit=2)])
    await h.wait_seen(("quota-near-limit:vision/H100", 1, True))
    await h.notifier.evaluate_flavors({"A100": 3}, {"H100": 4}, {"A100": 1.0, "H100": 2.0})
    await h.wait_seen(("idle-larger-flavor:A100", 1, False))
    assert {s for s, _ in h.alarms.messages} == {"claimbroker.v1.alerts.warning.quota-near-limit.vision",
                                                 "claimbroker.v1.alerts.info.idle-larger-flavor._fleet"}
