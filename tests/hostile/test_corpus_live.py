"""60 hostile cases (corpus.LIVE_SAMPLE, every class) published with raw nats-py on their exact subjects to
the live stack: nats-server, PostgreSQL, the watcher's built-in fleet and the allocator in-process.

One case at a time: publish it, give it time to leave its trace, then a normal claim must reach
Allocated within 1 second of its publication. At the end the allocator task must still be running, and
every case must have left a trace that matches its expectation:
- a status on its claim's subject: Rejected with a reason for a refused claim, Allocated or Pending for
  an accepted one (a release: Released);
- or an invalid-message alert naming the message (details.messageId), on NATS or in the outbox;
- or a row in dead_letters (when the ledger has that table) or a message-dead-lettered alert: the message
  could not be committed even on its own; accepted as a trace, listed apart;
- or, for a payload over the server's max_payload, the server's refusal at publish time.
Failures are collected over the whole run and reported together (an allocator that died is restarted so
that later cases are still tried, and its death is a failure).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from sqlalchemy import inspect, select

from services.allocator.app import allocator_app
from services.allocator.messages import inbox_id
from services.allocator.service import Allocator
from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.streams import ensure_streams
from services.watcher.files import FileWatcher
from shared.contract import subjects
from shared.dra.classes import BUILTIN_CLASSES
from shared.fleet.sources import BUILTIN_TOPOLOGY
from shared.ledger import schema
from shared.ledger.engine import create_engine, migrate, sessions
from tests.e2e.helpers import Collector, alerts, statuses
from tests.hostile.corpus import TENANT, Case, live_cases, normal_claim

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

GROUP = 1  # a normal claim after each case
SENTINEL_DEADLINE_S = 1.0
TRACE_WAIT_S = 8.0  # per group; a case that trips the CEL time guard costs about a second


def message_id(case: Case) -> str:
    if case.action == "release" and case.name and len(case.name) > 200:
        # As `claimbroker release` builds it: over the inbox column's 255 characters for a long name.
        return f"release:{case.subject_tenant}:{case.name}:{time.time_ns()}"
    return f"hostile-{case.id}"


class Run:
    """The stack under test and everything the cases left behind."""

    def __init__(self, url: str, engine: Any) -> None:
        self.url = url
        self.engine = engine
        self.allocator: Allocator | None = None
        self.task: asyncio.Task[Any] | None = None
        self.first_task: asyncio.Task[Any] | None = None
        self.failures: list[str] = []
        self.ids: dict[str, str] = {}  # case id -> Nats-Msg-Id
        self.publish_errors: dict[str, str] = {}
        self.latencies: list[float] = []  # publication to Allocated, of each group's normal claim
        self.statuses: Collector
        self.alerts: Collector

    async def start_allocator(self) -> None:
        self.allocator = Allocator(self.engine, BUILTIN_CLASSES)
        self.task = asyncio.create_task(allocator_app(self.url, self.allocator).run())
        self.first_task = self.first_task or self.task
        assert await self.allocator.wait_for_inventory(20)

    async def check_allocator(self, when: str) -> None:
        assert self.task is not None and self.allocator is not None
        if not self.task.done():
            return
        error = self.task.exception() if not self.task.cancelled() else "cancelled"
        self.failures.append(f"{when}: the allocator task ended: {error!r}")
        await self.start_allocator()

    async def stop(self) -> None:
        if self.allocator is not None and self.task is not None:
            self.allocator.stop()
            try:
                await asyncio.wait_for(self.task, 20)
            except Exception as error:  # reported with the other failures
                self.failures.append(f"stopping: the allocator task ended with {error!r}")

    def status_of(self, namespace: str, name: str | None) -> list[dict[str, Any]]:
        return self.statuses.for_claim(namespace, name) if name else []

    def alerts_for(self, msg_id: str, outbox: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Alerts that name the message, published or still in the outbox."""
        return [a for a in [a for _, a in self.alerts.messages] + outbox
                if isinstance(a.get("details"), dict) and a["details"].get("messageId") in (msg_id, inbox_id(msg_id))]


def observed(run: Run, case: Case, outbox: list[dict[str, Any]], dead: set[str]) -> tuple[str, str] | None:
    """What the case left behind: ("accepted" | "refused" | "dead-lettered" | "refused at publish", detail)."""
    msg_id = run.ids.get(case.id, "")
    if case.id in run.publish_errors:
        return "refused at publish", run.publish_errors[case.id]
    if case.action == "submit":
        states = run.status_of(case.subject_tenant, case.name)
        if states:
            last = states[-1]
            if last["state"] == "Rejected":
                return ("refused", f"Rejected: {last['reason']}") if last.get("reason") else None
            if last["state"] in ("Allocated", "Pending", "Released"):
                return "accepted", f"{last['state']}: {last.get('reason')}"
    else:
        states = [s for s in run.status_of(case.subject_tenant, case.name) if s["state"] == "Released"]
        if states:
            return "accepted", f"Released: {states[-1].get('reason')}"
    for alert in run.alerts_for(msg_id, outbox):
        if alert.get("kind") == "invalid-message":
            return "refused", f"invalid-message alert: {alert.get('summary', '')[:200]}"
        if alert.get("kind") == "message-dead-lettered":
            return "dead-lettered", f"message-dead-lettered alert: {alert.get('summary', '')[:200]}"
    if inbox_id(msg_id) in dead or msg_id in dead:
        return "dead-lettered", "a row in dead_letters"
    return None


def fits(case: Case, seen: str) -> bool:
    if seen == "accepted":
        return case.allows("accepted")
    if seen == "refused":
        return case.allows("rejected") or case.allows("invalid")
    return True  # dead-lettered, or refused at publish: a trace, listed in the report


def has_trace(run: Run, case: Case) -> bool:
    return observed(run, case, [], set()) is not None


async def ledger_traces(run: Run) -> tuple[list[dict[str, Any]], set[str]]:
    """Alert events in the outbox, and the message ids in dead_letters (when the ledger has that table)."""
    async with sessions(run.engine)() as session:
        rows = await session.scalars(select(schema.OutboxEvent).where(
            schema.OutboxEvent.subject.like(subjects.PREFIX + ".alerts.%")))
        outbox = [dict(row.payload) for row in rows]
        tables = await session.run_sync(lambda s: inspect(s.bind).get_table_names())
        dead: set[str] = set()
        model = getattr(schema, "DeadLetter", None)
        if "dead_letters" in tables and model is not None:
            dead = set(await session.scalars(select(model.message_id)))
    return outbox, dead


async def publish(run: Run, js: Any, case: Case, max_payload: int) -> None:
    msg_id = run.ids[case.id] = message_id(case)
    try:
        await js.publish(case.subject, case.payload, headers={"Nats-Msg-Id": msg_id})
    except Exception as error:  # the server's refusal is this case's trace, if it had to refuse
        if len(case.payload) <= max_payload:
            run.failures.append(f"{case.id}: publish failed: {type(error).__name__}: {error}")
        run.publish_errors[case.id] = f"{type(error).__name__}: {error}"


async def sentinel(run: Run, js: Any, index: int) -> None:
    """A normal claim after the group: Allocated within SENTINEL_DEADLINE_S of its publication."""
    name = f"sentinel-{index}"
    started = time.monotonic()
    await js.publish(subjects.submit(TENANT), normal_claim(name), headers={"Nats-Msg-Id": f"sentinel-{index}"})

    def allocated() -> bool:
        return any(s["state"] == "Allocated" for s in run.statuses.for_claim(TENANT, name))

    try:
        await run.statuses.wait_for(allocated, timeout=5.0)
    except TimeoutError:
        states = [(s["state"], s.get("reason")) for s in run.statuses.for_claim(TENANT, name)]
        run.failures.append(f"group {index}: the normal claim after it was not Allocated within 5 s: {states}")
        return
    took = time.monotonic() - started
    run.latencies.append(took)
    if took > SENTINEL_DEADLINE_S:
        run.failures.append(f"group {index}: the normal claim after it took {took:.2f}s to be Allocated")
    await js.publish(subjects.release(TENANT), json.dumps({"name": name}).encode(),
                     headers={"Nats-Msg-Id": f"sentinel-release-{index}"})


async def test_hostile_sample_through_the_live_stack(nats_server: EmbeddedNats, postgres_url: str,
                                                     tmp_path: Path) -> None:
    cases = live_cases()
    assert len(cases) == 60
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(yaml.safe_dump(BUILTIN_TOPOLOGY))
    await migrate(postgres_url)
    engine = create_engine(postgres_url)
    watcher = await connect(nats_server.url, name="watcher")
    await ensure_streams(watcher.jetstream())
    await FileWatcher(watcher.jetstream(), [inventory]).publish_once()
    tenant = await nats.connect(nats_server.url, name="hostile-tenant")
    js = tenant.jetstream()
    run = Run(nats_server.url, engine)
    try:
        run.statuses = await statuses(tenant)
        run.alerts = await alerts(tenant)
        await run.start_allocator()
        for index in range(0, len(cases), GROUP):
            group = cases[index:index + GROUP]
            for case in group:
                await publish(run, js, case, tenant.max_payload)
            deadline = time.monotonic() + TRACE_WAIT_S  # what is missing then is reported below, case by case
            while time.monotonic() < deadline and not all(has_trace(run, c) for c in group):
                await asyncio.sleep(0.05)
            await run.check_allocator(f"group {index // GROUP}")
            await sentinel(run, js, index // GROUP)
            await run.check_allocator(f"after group {index // GROUP}'s normal claim")
        await asyncio.sleep(0.2)
        outbox, dead = await ledger_traces(run)
        report = []
        for case in cases:
            seen = observed(run, case, outbox, dead)
            report.append(f"  {case.id:<36} {case.klass:<12} {case.expect:<9} "
                          f"{'NO TRACE' if seen is None else seen[0] + ': ' + seen[1][:120]}")
            if seen is None:
                run.failures.append(f"{case.id}: left no trace (no status on its claim's subject, no "
                                    f"invalid-message alert for message {run.ids.get(case.id)!r}, no dead letter)")
            elif not fits(case, seen[0]):
                run.failures.append(f"{case.id}: expected {case.expect}, got {seen[1]}")
        print("\nlive hostile sample:\n" + "\n".join(report))
        print("normal claims after each case, Allocated after: " + ", ".join(f"{t:.3f}s" for t in run.latencies))
        if run.first_task is not run.task or run.task is None or run.task.done():
            run.failures.append("the allocator task that served the first case is not running at the end")
    finally:
        await run.stop()
        await tenant.close()
        await watcher.close()
        await engine.dispose()
    assert not run.failures, f"{len(run.failures)} failure(s):\n" + "\n".join(run.failures)
