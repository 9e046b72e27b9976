"""The allocator: read a batch of claim messages, decide one cycle with the pure core, commit, ack, publish.

Exactly-once effects: each message id goes into the inbox in the same transaction as the cycle's
decisions and their outbox events; a redelivery (the process died between commit and ack) finds its
id and changes nothing. Every cycle first locks the shard's lease row (SELECT ... FOR UPDATE on
PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers) and reads the queue and the quotas
from the ledger, so two allocators on one database take turns and each decides on what the other
wrote: neither can exceed a quota, and device_allocations' primary key refuses a device twice. The
queue read takes only the claim rows written since this allocator's last cycle (by either allocator:
rows carry the lease revision they were written at), so its cost follows what changed, not the depth.
Quota changes from the admin API are read at the next cycle; a cycle also runs every
`cycle_interval` while claims wait, so they reach waiting claims without a message.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import json
import logging
import math
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from services import metrics
from services.allocator import ledger_ops as ops
from services.allocator.batch import (
    DEFAULT_EARLY_RELEASES_PER_TENANT,
    RELEASE_ANSWER_TTL_S,
    apply_messages,
    inbox_key,
    printable,
    read_message,
)
from services.consumer import PullConsumer
from services.logs import BATCHES
from services.natsio import ensure_streams, publish_pipelined
from services.outage import Outage, publish_degraded, until_done
from services.retention import Pruner
from services.runtime import CollectorPacing
from shared.admission.cycle import run_cycle
from shared.admission.kept import KeptState
from shared.admission.model import Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.contract import events, subjects
from shared.contract.messages import NodeInventory
from shared.dra import model as dra
from shared.dra.budget import TENANT_BUDGET
from shared.dra.inventory import Fleet
from shared.dra.results import State
from shared.fleet.freshness import judge
from shared.ledger import inbox
from shared.ledger.engine import sessions
from shared.ledger.quota_store import load_quota_config
from shared.ledger.schema import DEAD_LETTER_PAYLOAD_LIMIT, DeadLetter, OutboxEvent

log = logging.getLogger("claimbroker.allocator")
batch_log = logging.getLogger(BATCHES)  # one line per decision batch, in JSON logs
CONSUMER = "allocator"


class Allocator:
    def __init__(
        self,
        engine: AsyncEngine,
        classes: Mapping[str, dra.DeviceClass],
        *,
        batch: int = 512,
        ack_wait: float = 5.0,
        max_deliver: int = 10,
        inventory_ttl: float = 90.0,
        cycle_interval: float = 1.0,
        reason_refresh: float = 60.0,
        depth_interval: float = 1.0,
        shard: str = "default",
        min_runtime: float = 0.0,
        tenant_budget: int = TENANT_BUDGET,
        continue_after: float = 0.1,
        clock: Callable[[], float] = time.time,
        inbox_retention: float = 3600.0,
        early_releases_per_tenant: int = DEFAULT_EARLY_RELEASES_PER_TENANT,
        release_answer_ttl: float = RELEASE_ANSWER_TTL_S,
        prune_interval: float = 10.0,
    ) -> None:
        self.nc: Client  # both bound by run(): its FastStream app's connection
        self.js: JetStreamContext
        self.sessions = sessions(engine)
        self.classes = dict(classes)
        self.fleet = Fleet()
        self.kept = KeptState()  # selector results and the cycle's states, kept from one cycle to the next
        self.queue_cache = ops.QueueCache()
        self.collector = CollectorPacing()  # what a cycle keeps is frozen: young GC passes skip it
        self.batch = batch
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.inventory_ttl = inventory_ttl
        self.cycle_interval = cycle_interval
        self.reason_refresh = reason_refresh
        self._answered_at: dict[tuple[str, str], float] = {}  # when a Pending claim was last answered
        self._matched_at = -math.inf  # when _answered_at was last matched against every waiting claim
        self.shard = shard
        self.min_runtime = min_runtime  # for tenants without a minRuntime of their own
        self.tenant_budget = tenant_budget  # placement work per tenant and cycle (shared/dra/budget.py)
        self.continue_after = continue_after  # the next cycle, while placement work was left over
        self._work_left = False  # the last cycle cut some placement short: it goes on soon
        # Message ids are kept `inbox_retention` (a re-sent message within it changes nothing), releases of
        # unknown claims as long, at most `early_releases_per_tenant` per tenant; their answers expire
        # after `release_answer_ttl` where the status stream allows it (`_answers_expire`).
        self.early_releases_per_tenant = early_releases_per_tenant
        self.release_answer_ttl = release_answer_ttl
        self._answers_expire = False
        self.pruner = Pruner(self.sessions, [_prune_inbox, ops.prune_early_releases], inbox_retention, clock,
                             interval=prune_interval)
        self.holder = f"{socket.gethostname()}:{id(self):x}"
        self.clock = clock
        self.lost_nodes: set[str] = set()
        self._heard: dict[str, Heard] = {}  # per node: its last inventory
        self._set_aside: dict[tuple[str, str], float] = {}  # claims that hit an internal error: until when
        self.nats_outage = Outage("NATS", log)
        self.startup_outage = Outage("the ledger or NATS", log)  # reading what a crash left, at start
        self.ledger_outage = Outage("the ledger", log)  # a batch held while the ledger does not answer
        self._outbox_behind = False  # committed events wait in the outbox: publish them as soon as NATS takes them
        self._cycle_failure_reported = -math.inf  # when a failing cycle was last logged with its trace and alerted
        self._cycle_failing = False  # the last decision cycle failed (readiness)
        self._fleet_changed = asyncio.Event()
        self._inventory_seen = asyncio.Event()
        self._publish_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._waiting = True  # whether the last cycle left claims waiting: then cycles keep running
        self._decided: collections.Counter[str] = collections.Counter()  # by the transaction under way
        self._flavors_of: dict[tuple[str, str], tuple[str, ...]] = {}  # waiting claims' flavors, for metrics
        self._queue_for_metrics: Mapping[tuple[str, str], Any] | None = None
        self._depth_at = 0.0
        self._outbox_due = asyncio.Event()  # a commit wrote events: the publisher task publishes them
        self.depth_interval = depth_interval  # the queue-depth metric walks the queue: at most this often

    def not_ready(self) -> str | None:
        """Why it cannot decide now (for /readyz), or None."""
        for outage in (self.nats_outage, self.startup_outage, self.ledger_outage):
            if (why := outage.why()) is not None:
                return why
        if not self._inventory_seen.is_set():
            return "no inventory read yet"
        if self._cycle_failing:
            return "decision cycles are failing (see the log)"
        return None

    def stop(self) -> None:
        """Finish the batch in hand, then return from run(); no transaction is cut in half."""
        self._stopping.set()

    async def run(self, nc: Client, subscribe: Callable[[], Awaitable[object]]) -> None:
        """Rebuild from the ledger and the inventory stream, then serve until cancelled. `subscribe` starts
        the app's inventory subscriber (services/channels.py), which calls on_inventory."""
        self.nc, self.js = nc, nc.jetstream()
        await until_done(self._prepare_streams, self.nats_outage)
        # events committed before a crash but never published (needs the ledger and NATS)
        await until_done(self.publish_outbox, self.startup_outage)
        await until_done(subscribe, self.nats_outage)
        claims = PullConsumer(self.nc, stream=subjects.CLAIMS_STREAM, durable=CONSUMER,
                              subject=subjects.PREFIX + ".claims.>",
                              filter_subjects=[subjects.SUBMIT_ALL, subjects.RELEASE_ALL], ack_wait=self.ack_wait,
                              max_deliver=self.max_deliver, batch=self.batch, log=log,
                              outage=self.nats_outage, on_recovered=self._nats_recovered)
        await claims.open()
        publisher = asyncio.create_task(self._publisher(), name="allocator-outbox")
        log.info("allocator ready")
        next_cycle = 0.0
        try:
            while not self._stopping.is_set():
                interval = self.continue_after if self._work_left else self.cycle_interval
                messages = await claims.fetch(timeout=min(0.5, interval))
                if self._stopping.is_set():
                    for message in messages:
                        await claims.nak(message, None)
                    break
                now = time.monotonic()
                due = self._fleet_changed.is_set() or ((self._waiting or self._work_left) and now >= next_cycle)
                if messages or due:
                    self._fleet_changed.clear()
                    next_cycle = now + (self.continue_after if self._work_left else self.cycle_interval)
                    async with claims.in_hand(messages):
                        await self._handle(messages)
                await self.pruner.run_if_due()  # between transactions: no decision waits on it
        finally:
            publisher.cancel()
            with contextlib.suppress(BaseException):  # it ends at its next await
                await publisher
            if self._stopping.is_set():  # a clean stop publishes what committed, within a bound
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._publish_outbox_when_possible(), 5)

    async def _prepare_streams(self) -> None:
        """The contract's streams; and whether the status stream takes per-message TTLs (nats-server 2.11 and
        later, allow_msg_ttl): without, an answer with a TTL would be refused, so answers go without one."""
        await ensure_streams(self.js)
        config = (await self.js.stream_info(subjects.STATUS_STREAM)).config
        self._answers_expire = bool(config.allow_msg_ttl)

    async def _publisher(self) -> None:
        """Publishes what each commit put in the outbox, beside the decisions: the next batch is decided
        while NATS acknowledges the last one's statuses (awaited in line, publishing took a third of each
        batch's time under a burst). One task, so the outbox goes out in commit order; while NATS or the
        ledger is away it tries again with backoff, and the events wait in the outbox meanwhile."""
        outage = Outage("publishing the outbox", log)
        while True:
            await self._outbox_due.wait()
            self._outbox_due.clear()
            await self._publish_outbox_when_possible()
            if self._outbox_behind:
                await outage.failed(RuntimeError("the outbox could not be published"))
                self._outbox_due.set()
            else:
                outage.ok()

    async def _nats_recovered(self, lasted: float) -> None:
        await self._degraded(f"NATS was unreachable for {lasted:.0f}s", resolved=True)

    async def on_inventory(self, inventory: NodeInventory) -> None:
        """One node's inventory, from the app's typed subscriber (an ordered consumer: no acks)."""
        heard = self._heard.get(inventory.node)
        if heard is not None and inventory.sequence and heard.sequence > inventory.sequence:
            return  # an older snapshot arriving late
        content = _fingerprint(inventory)
        if heard is not None and heard.content == content and not inventory.removed:
            # A heartbeat: the node is alive and unchanged. It is not parsed again, and the fleet stays the
            # same object, so the cycle's indexes stay valid (500 nodes' heartbeats at once stalled cycles);
            # when it was last heard lives here, beside the fleet (a fleet node's observed_at is when its
            # content was last read, not when the node was last heard).
            self._heard[inventory.node] = Heard(inventory.sequence, inventory.observedAtUnix, content)
            if judge(heard.at, self.clock(), self.inventory_ttl).stale:
                self._fleet_changed.set()  # it was stale: waiting claims may go there again
            return
        try:
            node = events.read_inventory(inventory.model_dump())
        except (ValueError, dra.DocumentError) as error:
            log.warning("ignoring invalid inventory of node %s: %s", inventory.node, error)
            return
        self._heard[node.node] = Heard(node.sequence, 0.0 if node.removed else node.observed_at, content)
        self._inventory_seen.set()
        if node.removed and node.node in self.fleet.nodes:
            self.lost_nodes.add(node.node)
        elif not node.removed:
            self.lost_nodes.discard(node.node)
        self.fleet = self.fleet.with_node(node)
        self._fleet_changed.set()

    async def _handle(self, messages: Sequence[Msg]) -> None:
        """Decide the batch in one transaction; when it fails, no message takes another with it: the
        messages are decided one at a time, and one that still fails on its own (while the cycle without
        it commits) is set aside in the dead-letter table with its error and an alert, then acked."""
        failure: Exception | None = None
        while True:
            try:
                await self._decide_messages(messages)
            except Exception as error:  # noqa: BLE001 - the batch's fate is decided below
                self._fleet_changed.set()
                failure = error
                if not _is_transient(error) or self._stopping.is_set():
                    break
                # The ledger is away or busy: the same batch again once it is back. Its messages stay in
                # hand (marked in progress), so an outage spends none of their deliveries (max_deliver),
                # and no batch is split into hundreds of transactions that would each fail the same way.
                if self.ledger_outage.since is None and not self._cycle_failing:
                    self._cycle_failing = True
                    await self._degraded(f"the ledger does not answer: {type(error).__name__}: "
                                         f"{printable(str(error), 300)}")
                await self.ledger_outage.failed(error)
                continue
            self.ledger_outage.ok()
            failure = None
            break
        if failure is not None:
            if _is_transient(failure):  # told to stop while the ledger is away: another replica takes them
                for message in messages:
                    await PullConsumer.nak(message, None)
                return
            if len(messages) > 1:
                log.warning("batch of %d failed (%s: %s); deciding its messages one at a time", len(messages),
                            type(failure).__name__, printable(str(failure), 300))
                for message in messages:
                    await self._handle([message])
                return
            await self._handle_failure(messages[0] if messages else None, failure)
            return
        if self._cycle_failing:
            self._cycle_failing = False
            await self._degraded("decision cycles commit again", resolved=True)
        try:
            await PullConsumer.ack_all(messages)
        except Exception as error:  # noqa: BLE001 - committed: a redelivery finds them in the inbox
            log.warning("acks of %d committed message(s) failed (%s); their redelivery changes nothing",
                        len(messages), type(error).__name__)
        self._outbox_due.set()  # the publisher takes it from here

    async def _publish_outbox_when_possible(self) -> None:
        """Publish what committed; while NATS or the ledger is down the events wait in the outbox for the
        next cycle (nothing is lost, and the allocator goes on)."""
        try:
            await self.publish_outbox()
        except Exception as error:  # noqa: BLE001
            if not self._outbox_behind:
                log.warning("outbox not published yet (%s: %s); trying again until it is", type(error).__name__,
                            printable(str(error), 200))
            self._outbox_behind = True
        else:
            self._outbox_behind = False

    async def _handle_failure(self, message: Msg | None, error: Exception) -> None:
        """One message's transaction failed, or a cycle with none. A passing fault (a busy database,
        another allocator first to a device) is retried; a message that fails alone while the cycle
        without it commits is the message's fault: dead-lettered. Otherwise the cycle itself fails: the
        message waits for it, and an internal-error alert says so."""
        transient = isinstance(error, IntegrityError | OperationalError) or _is_transient(error)
        deliveries = message.metadata.num_delivered if message is not None else 0
        # A message is blamed only once it has failed alone on a second delivery: a fault that passes (and
        # is not recognised as passing) must not dead-letter a good claim.
        if message is not None and (transient or deliveries < 2) and deliveries < self.max_deliver - 1:
            log.warning("ledger refused a message (%s); redelivering it", type(error).__name__)
            await PullConsumer.nak(message, 0.2 * deliveries)
            return
        cycle_fails = None
        if message is not None:
            try:
                await self._decide_messages([])
            except Exception as cycle_error:  # noqa: BLE001
                cycle_fails = cycle_error
            else:
                if await self._dead_letter(message, error):
                    with contextlib.suppress(Exception):  # handled in the inbox: a redelivery changes nothing
                        await message.ack()
                    self._outbox_due.set()
                    return
        failure = cycle_fails or error
        if not self._cycle_failing:
            self._cycle_failing = True
            await self._degraded(f"decision cycles fail: {type(failure).__name__}: {printable(str(failure), 300)}")
        now = time.monotonic()
        if now >= self._cycle_failure_reported + 60:  # a cycle retried every second: its trace once a minute
            self._cycle_failure_reported = now
            log.error("decision cycle failed: %s: %s", type(failure).__name__, printable(str(failure), 500),
                      exc_info=failure)
        else:
            log.warning("decision cycle failed again: %s", type(failure).__name__)
        if message is not None:
            await PullConsumer.nak(message, min(5.0, 0.5 * max(deliveries, 1)))

    async def _dead_letter(self, message: Msg, error: Exception) -> bool:
        """Keep the message and its error, mark it handled and alert, in one transaction; False when even
        that cannot be written (the database is down: the message is redelivered instead)."""
        key = _message_key(message)
        message_id = key.message_id
        reason = f"{type(error).__name__}: {printable(str(error), 2000)}"
        log.error("dead-lettered message %s on %s: %s", message_id, printable(message.subject, 300), reason)
        try:
            async with self.sessions() as session, session.begin():
                if await inbox.seen(session, CONSUMER, [key]):
                    return True
                await inbox.record(session, CONSUMER, [key], datetime.fromtimestamp(self.clock(), UTC))
                subject = printable(message.subject, 1000)
                session.add(DeadLetter(consumer=CONSUMER, message_id=message_id, subject=subject,
                                       payload=message.data[:DEAD_LETTER_PAYLOAD_LIMIT],
                                       payload_size=len(message.data), error=reason,
                                       deliveries=message.metadata.num_delivered or 1))
                ops.emit_event(session, *_alert(
                    "message-dead-lettered", message_id, f"alert:dead:{message_id}",
                    f"a message on {subject[:200]} could not be committed and was set aside: {reason[:300]}",
                    {"messageId": message_id, "subject": subject, "error": reason}))
                await ops.write_buffered(session)
        except Exception as write_error:  # noqa: BLE001
            log.error("could not dead-letter message %s: %s", message_id, write_error)
            return False
        return True

    async def _degraded(self, why: str, *, resolved: bool = False) -> None:
        await publish_degraded(self.js, "allocator", why, log, resolved=resolved)

    def last_heard(self) -> dict[str, float]:
        """When each node of the fleet was last heard (any inventory message, heartbeats included): what
        /v1/nodes judges freshness by when the API runs in this process (shared/fleet/freshness.py)."""
        return {name: heard.at for name, heard in self._heard.items() if name in self.fleet.nodes}

    def _unusable_nodes(self) -> dict[str, str]:
        """Stale nodes (shared/fleet/freshness.py) get no new allocation. The reason names when the node was
        last heard, not its age: it stays the same from cycle to cycle, so the decision core keeps its
        state instead of rebuilding it for a new text."""
        now = self.clock()
        return {name: verdict.reason for name in self.fleet.nodes
                if (verdict := judge(self._heard[name].at if name in self._heard else None, now,
                                     self.inventory_ttl)).stale}

    async def _decide_messages(self, messages: Sequence[Msg]) -> None:
        """One transaction: the batch's inbox rows and claim changes, one decision cycle, its events."""
        started = time.perf_counter()
        self._decided.clear()
        try:
            async with self.sessions() as session, session.begin():
                await ops.lock_shard(session, self.shard, self.holder,
                                     self.clock() + 3 * self.cycle_interval + 30)
                keys = [_message_key(message) for message in messages]
                done = await inbox.seen(session, CONSUMER, keys)
                fresh, recorded = [], []
                for message, key in zip(messages, keys, strict=True):
                    if key in done:
                        continue  # a redelivery, a re-sent message, or a duplicate in this batch
                    done.add(key)
                    recorded.append(key)
                    fresh.append(read_message(message.subject, message.data, key.message_id,
                                              message.metadata.sequence.stream))
                now = datetime.fromtimestamp(self.clock(), UTC)
                await inbox.record(session, CONSUMER, recorded, now)
                # the quotas, read once: submissions are checked against maxPending, the cycle decides on them
                config = await load_quota_config(session) if any(m.claim is not None for m in fresh) else None
                if await apply_messages(session, fresh, config, now=now,
                                        early_releases_per_tenant=self.early_releases_per_tenant,
                                        answer_ttl=self.release_answer_ttl):
                    self._waiting = True  # claims to place, or devices freed that may let waiting claims in
                handled = await self._cycle(session, config)
                await ops.write_buffered(session)
                self._decided.update(ops.states_written(session))
        except BaseException:
            self.queue_cache.invalidate()  # it read rows this transaction wrote, which are gone with it
            raise
        self.lost_nodes -= handled  # only once committed: a cycle that rolled back handles them again
        self._record_metrics(len(messages), time.perf_counter() - started)

    async def _cycle(self, session: AsyncSession, config: QuotaConfig | None = None) -> set[str]:
        """Send lost nodes' claims back to the queue, decide, write; returns the lost nodes it handled.
        `config`: the quotas, when this transaction read them already."""
        lost = set(self.lost_nodes)
        if lost:
            stranded = await ops.claims_on_nodes(session, lost)
            await ops.release_devices(session, [row.id for row in stranded])
            for stranded_row in stranded:
                stranded_row.reason = f"node {row_node_of(stranded_row)} was lost; waiting to be placed again"
                stranded_row.state, stranded_row.allocation, stranded_row.node = State.PENDING.value, None, None
                ops.emit_status(session, stranded_row)
                stranded_row.reason = None  # not answered yet: the cycle below decides it like a new claim
        queue = await ops.load_queue(session, self.queue_cache)
        self._queue_for_metrics = queue.waiting
        if not queue.waiting:
            self._waiting = self._work_left = False
            self._answered_at.clear()
            return lost
        self._refresh_stale_reasons(queue)
        config = config if config is not None else await load_quota_config(session)
        waiting, changes = queue.waiting.snapshot()
        if self._set_aside:  # compared in full, not by the changes recorded
            waiting = self._without_set_aside(waiting, queue)
        if config.default_min_runtime != self.min_runtime:
            config = replace(config, default_min_runtime=self.min_runtime)
        cycle_at = self.clock()
        limited = any(t.max_preemptions_per_minute is not None for t in config.tenants.values())
        recent = await ops.recent_preemptions(session, cycle_at - 60.0) if limited else {}
        snapshot = Snapshot(self.fleet, self.classes, config, tuple(queue.running.values()), waiting,
                            self._unusable_nodes(), None if self._set_aside else changes, now=cycle_at,
                            recent_preemptions=recent, tenant_budget=self.tenant_budget)
        started = time.perf_counter()
        result = run_cycle(snapshot, self.kept)
        self._work_left = result.deferred > 0
        metrics.CYCLE_SECONDS.observe(time.perf_counter() - started)
        self.collector.after_cycle()
        now = datetime.now(UTC)
        rows = await ops.claim_rows(session, queue, itertools.chain(
            (p.victim for p in result.preemptions), ((d.tenant, d.name) for d in result.decisions)))
        await ops.release_devices(session, [rows[p.victim].id for p in result.preemptions])
        for preemption in result.preemptions:
            row = rows[preemption.victim]
            by = "/".join(preemption.by)
            row.state, row.reason, row.allocation, row.node = State.PREEMPTED.value, preemption.reason, None, None
            ops.emit_status(session, row, by=by)
            row.state, row.reason = State.PENDING.value, f"{preemption.reason}; waiting to be placed again"
            ops.emit_status(session, row)
            row.reason = None  # not answered yet: the next cycle decides it like a new claim
        settled = 0  # waiting claims admitted or Rejected
        answered_now, answered_at = self.clock(), self._answered_at
        for decided in result.decisions:
            key = (decided.tenant, decided.name)
            row = rows[key]
            decision = decided.decision
            if decision.state is State.PENDING:
                answered_at.pop(key, None)  # to the end: answers stay oldest first
                answered_at[key] = answered_now
            elif key in queue.waiting:
                settled += 1
            if decided.internal_error is not None:
                self._set_aside[key] = answered_now + self.reason_refresh
                self._emit_internal_error(session, key, decided.internal_error, row.sequence)
            changed = ops.apply_decision(session, row, decision, result.flavors)
            row.explain = dict(decided.explain) if decided.explain is not None else None
            if decided.explain is not None:
                self._flavors_of[key] = tuple(decided.explain.get("flavors") or ())
            if decision.allocation is not None:
                row.allocated_at = now
            if changed:
                ops.emit_status(session, row, unsatisfiable=decision.unsatisfiable)
        for preemption in result.preemptions:
            self._decided[f"preempted:{preemption.rule}"] += 1
        self._waiting = len(queue.waiting) > settled or bool(result.preemptions)
        return lost

    def _record_metrics(self, messages: int, seconds: float) -> None:
        """After a commit: what it decided, how long it took, and (at most once a second, it walks the
        queue) the queue's depth per tenant and flavor."""
        metrics.TRANSACTION_SECONDS.observe(seconds)
        metrics.BATCH_MESSAGES.observe(messages)
        if messages or self._decided:
            batch_log.info("decision batch", extra={
                "messages": messages, "decided": dict(self._decided), "transaction_ms": round(seconds * 1000, 1),
                "waiting": len(self._queue_for_metrics or ())})
        for what, count in self._decided.items():
            if what.startswith("preempted:"):
                metrics.PREEMPTIONS.labels(what.split(":", 1)[1]).inc(count)
            else:
                metrics.DECISIONS.labels(what).inc(count)
        now = time.monotonic()
        if self._queue_for_metrics is not None and now >= self._depth_at + self.depth_interval:
            self._depth_at = now
            waiting, flavors_of = self._queue_for_metrics, self._flavors_of
            for key in flavors_of.keys() - waiting.keys():
                del flavors_of[key]
            metrics.set_queue_depth((tenant, flavor) for (tenant, name) in waiting
                                    for flavor in flavors_of.get((tenant, name)) or ("any",))

    def _without_set_aside(self, waiting: tuple[Waiting, ...], queue: ops.Queue) -> tuple[Waiting, ...]:
        """Claims whose deciding failed through a fault of ours sit out `reason_refresh` (each try costs the
        core a cycle built anew), then are tried again; the queue is then compared in full, not by changes."""
        now = self.clock()
        for key, until in list(self._set_aside.items()):
            if until <= now or key not in queue.waiting:
                del self._set_aside[key]
        return tuple(w for w in waiting if w.key not in self._set_aside)

    @staticmethod
    def _emit_internal_error(session: AsyncSession, key: tuple[str, str], error: str, sequence: int) -> None:
        tenant, name = key
        ops.emit_event(session, *_alert(
            "internal-error", f"{tenant}/{name}", f"alert:internal:{tenant}/{name}:{sequence}",
            f"internal error while deciding claim {tenant}/{name}: {error}",
            {"tenant": tenant, "claim": name, "error": error}, tenant=tenant))

    def _refresh_stale_reasons(self, queue: ops.Queue) -> None:
        """Claims answered longer than `reason_refresh` ago are asked again: the core answers only claims
        without an answer (and changes of state), so this keeps reasons current at a bounded cost. Answer
        times are kept oldest first, so only the stale ones are looked at, not every waiting claim; a
        stale one no longer waiting is forgotten then. Once a refresh period the answer times are matched
        against every waiting claim (claims this allocator did not answer, after a restart or by another
        allocator, count as answered now): a walk over every waiting claim, too much for every cycle."""
        now = self.clock()
        answered_at, waiting = self._answered_at, queue.waiting
        if now >= self._matched_at + self.reason_refresh:
            self._matched_at = now
            for key in answered_at.keys() - waiting.keys():  # no longer waiting: forgotten
                del answered_at[key]
            for key in waiting.keys() - answered_at.keys():  # unknown: as of now
                answered_at[key] = now
        stale = list(itertools.takewhile(lambda item: now - item[1] >= self.reason_refresh, answered_at.items()))
        for key, _ in stale:  # oldest first
            claim = waiting.get(key)
            if claim is None:
                del answered_at[key]
            elif claim.answered:
                waiting.put(replace(claim, answered=False))

    async def publish_outbox(self) -> None:
        """Publish committed events in order; Nats-Msg-Id makes a re-publish after a crash harmless."""
        async with self._publish_lock:
            while True:
                # Read, publish, then mark in a second short transaction: no ledger lock is held while
                # we wait on NATS (SQLite has one writer), and a crash in between only re-publishes
                # events that JetStream then drops as duplicates.
                async with self.sessions() as session, session.begin():
                    rows = [(r.id, r.subject, r.payload, r.message_id, r.ttl_s if self._answers_expire else None)
                            for r in await ops.unpublished(session)]
                metrics.OUTBOX_UNPUBLISHED.set(len(rows))
                if not rows:
                    return
                await publish_pipelined(self.js, [(subject, payload, message_id)
                                                  for _, subject, payload, message_id, _ in rows],
                                        ttls=[ttl for *_, ttl in rows])
                async with self.sessions() as session, session.begin():
                    await ops.mark_published(session, [row_id for row_id, *_ in rows])

    async def wait_for_inventory(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._inventory_seen.wait(), timeout)
        except TimeoutError:
            return False
        return True


@dataclass(frozen=True)
class Heard:
    """A node's last inventory: its sequence, when it was observed (0 once removed), and a digest of its
    content (slices, labels, telemetry), which tells a heartbeat from a change without parsing it."""

    sequence: int
    at: float
    content: bytes


def _fingerprint(inventory: NodeInventory) -> bytes:
    parts = [inventory.removed, inventory.slices, inventory.labels, inventory.telemetry]
    try:
        content = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):  # an integer beyond 64 bits
        content = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.blake2b(content, digest_size=16).digest()


def _message_key(message: Msg) -> inbox.Key:
    """The message's id in the inbox: its Nats-Msg-Id (else its stream sequence), within its kind and tenant."""
    return inbox_key(message.subject, (message.headers or {}).get("Nats-Msg-Id"), message.metadata.sequence.stream)


async def _prune_inbox(session: AsyncSession, before: datetime, limit: int) -> int:
    return await inbox.prune(session, CONSUMER, before, limit)


def _is_transient(error: BaseException) -> bool:
    """A lost connection (PostgreSQL restarted, a backend terminated), a serialization failure, a deadlock
    or a lock timeout: deciding again succeeds."""
    if getattr(error, "connection_invalidated", False):  # SQLAlchemy's mark of a disconnect
        return True
    driver_error = getattr(error, "orig", None)
    code = getattr(driver_error, "sqlstate", None) or getattr(driver_error, "pgcode", None)
    return code in ("40001", "40P01", "55P03", "57P01", "57P02", "57P03", "08006", "08003") or isinstance(
        error, ConnectionError | TimeoutError)


def _alert(kind: str, about: str, message_id: str, summary: str, details: dict[str, Any], *,
           tenant: str | None = None) -> tuple[str, str, dict[str, Any]]:
    """A critical alert of the allocator's own: its subject, outbox message id and payload."""
    now = time.time()
    payload = events.alert(kind=kind, severity="critical", key=f"{kind}:{about}", summary=summary, details=details,
                           labels={"tenant": tenant} if tenant else {}, first_seen=now, last_seen=now)
    return subjects.alert("critical", kind, tenant), message_id, payload


def row_node_of(row: Any) -> str:
    return str(row.node or (row.allocation or {}).get("nodeName") or "?")


__all__ = ["Allocator", "OutboxEvent"]
