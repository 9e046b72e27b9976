"""The allocator: read a batch of claim messages, decide one cycle with the pure core, commit, ack, publish.

`Allocator` composes parts with one job each:
- `inventory` (inventory.py): the fleet from the inventory stream, stale and lost nodes;
- `intake` (intake.py): each fetched batch through the consumer shell (services/bus/consumer.py): acked once
  committed, held while the ledger is away, a message at fault dead-lettered;
- `transaction` (transaction.py): the decision transaction, the batch applied to the claims
  (claim_batch.py) and one decision `cycle` (cycle.py), whose waiting claims' reasons are kept current
  (reasons.py) and whose metrics are recorded (decision_metrics.py);
- `relay` (outbox_relay.py): the committed events published in order;
- `estimator` (estimator.py): start estimates of the waiting claims, beside the decisions, published as statuses.
A cycle also runs every `cycle_interval` while claims wait, so quota changes reach waiting claims without a
message, and `continue_after` while a cycle cut placement work short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping

from nats.aio.client import Client
from nats.js import JetStreamContext

from services.allocator.claim_batch import DEFAULT_EARLY_RELEASES_PER_TENANT, RELEASE_ANSWER_TTL_S
from services.allocator.cycle import DecisionCycle
from services.allocator.decision_metrics import DecisionMetrics
from services.allocator.estimator import Estimator
from services.allocator.intake import ClaimIntake
from services.allocator.inventory import Inventory
from services.allocator.messages import CONSUMER
from services.allocator.outbox_relay import OutboxRelay
from services.allocator.transaction import DecisionTransaction
from services.bus.consumer import PullConsumer
from services.bus.streams import ensure_streams
from services.runtime.ledger_pruning import Pruner
from services.runtime.outage import Outage, publish_degraded, until_done
from shared.admission.quota import DEFAULT_GANG_RESERVE_AFTER
from shared.contract import subjects
from shared.contract.messages import NodeInventory
from shared.dra import model as dra
from shared.dra.budget import TENANT_BUDGET
from shared.dra.inventory import Fleet
from shared.ledger import inbox, intake
from shared.ledger.engine import sessions
from shared.ledger.handles import AsyncEngine

log = logging.getLogger("claimbroker.allocator")


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
        depth_interval: float = 5.0,
        shard: str = "default",
        min_runtime: float = 0.0,
        gang_reserve_after: float = DEFAULT_GANG_RESERVE_AFTER,
        tenant_budget: int = TENANT_BUDGET,
        continue_after: float = 0.1,
        clock: Callable[[], float] = time.time,
        inbox_retention: float = 3600.0,
        early_releases_per_tenant: int = DEFAULT_EARLY_RELEASES_PER_TENANT,
        release_answer_ttl: float = RELEASE_ANSWER_TTL_S,
        prune_interval: float = 10.0,
        estimate_interval: float = 0.0,
    ) -> None:
        self.nc: Client  # both bound by run(): its FastStream app's connection
        self.js: JetStreamContext
        self.sessions = sessions(engine)
        self.batch, self.ack_wait, self.max_deliver = batch, ack_wait, max_deliver
        self.cycle_interval = cycle_interval
        self.continue_after = continue_after  # the next cycle, while placement work was left over
        self.inventory = Inventory(inventory_ttl, clock)
        metrics = DecisionMetrics(depth_interval)
        self.cycle = DecisionCycle(classes, self.inventory, metrics, reason_refresh=reason_refresh,
                                   min_runtime=min_runtime, gang_reserve_after=gang_reserve_after,
                                   tenant_budget=tenant_budget, clock=clock)
        self.relay = OutboxRelay(self.sessions)
        self.transaction = DecisionTransaction(
            self.sessions, self.cycle, metrics, shard=shard, holder=f"{socket.gethostname()}:{id(self):x}",
            cycle_interval=cycle_interval, clock=clock, early_releases_per_tenant=early_releases_per_tenant,
            release_answer_ttl=release_answer_ttl, relay=self.relay)
        # start estimates beside the decisions, off their transactions (0: none)
        self.backlog = False  # the last fetch brought a full batch
        self.estimator = (Estimator(self.sessions, self.cycle, self.relay, shard=shard, interval=estimate_interval,
                                    clock=clock, busy=lambda: self.backlog or self.cycle.work_left)
                          if estimate_interval > 0 else None)
        self.nats_outage = Outage("NATS", log)
        self.startup_outage = Outage("the ledger or NATS", log)  # reading what a crash left, at start
        self.ledger_outage = Outage("the ledger", log)  # a batch held while the ledger does not answer
        self._stopping = asyncio.Event()
        self.intake = ClaimIntake(self.transaction, self.relay, self.sessions, max_deliver=max_deliver,
                                  ledger_outage=self.ledger_outage, stopping=self._stopping.is_set,
                                  report=self._report, cycle_due=self.inventory.changed.set, clock=clock)
        # Message ids are kept `inbox_retention` (a re-sent message within it changes nothing), releases of
        # unknown claims as long.
        self.pruner = Pruner(self.sessions, [inbox.pruning(CONSUMER), intake.prune_early_releases],
                             inbox_retention, clock, interval=prune_interval)

    @property
    def fleet(self) -> Fleet:
        return self.inventory.fleet

    @fleet.setter
    def fleet(self, fleet: Fleet) -> None:
        self.inventory.fleet = fleet

    @property
    def release_answer_ttl(self) -> float:
        return self.transaction.release_answer_ttl

    @release_answer_ttl.setter
    def release_answer_ttl(self, ttl: float) -> None:
        self.transaction.release_answer_ttl = ttl

    def not_ready(self) -> str | None:
        """Why it cannot decide now (for /readyz), or None."""
        for outage in (self.nats_outage, self.startup_outage, self.ledger_outage):
            if (why := outage.why()) is not None:
                return why
        if not self.inventory.seen.is_set():
            return "no inventory read yet"
        if self.intake.failing:
            return "decision cycles are failing (see the log)"
        return None

    def stop(self) -> None:
        """Finish the batch in hand, then return from run(); no transaction is cut in half."""
        self._stopping.set()

    async def on_inventory(self, inventory: NodeInventory) -> None:
        await self.inventory.on_inventory(inventory)

    def last_heard(self) -> dict[str, float]:
        return self.inventory.last_heard()

    async def wait_for_inventory(self, timeout: float) -> bool:
        return await self.inventory.wait_for_inventory(timeout)

    async def publish_outbox(self) -> None:
        await self.relay.publish()

    async def run(self, nc: Client, subscribe: Callable[[], Awaitable[object]]) -> None:
        """Rebuild from the ledger and the inventory stream, then serve until cancelled. `subscribe` starts
        the app's inventory subscriber (services/bus/channels.py), which calls on_inventory."""
        self.nc, self.js = nc, nc.jetstream()
        self.relay.js = self.js
        await until_done(self._prepare_streams, self.nats_outage)
        # events committed before a crash but never published (needs the ledger and NATS)
        await until_done(self.relay.publish, self.startup_outage)
        await until_done(subscribe, self.nats_outage)
        claims = PullConsumer(self.nc, stream=subjects.CLAIMS_STREAM, durable=CONSUMER,
                              subject=subjects.PREFIX + ".claims.>",
                              filter_subjects=[subjects.SUBMIT_ALL, subjects.RELEASE_ALL], ack_wait=self.ack_wait,
                              max_deliver=self.max_deliver, batch=self.batch, log=log,
                              outage=self.nats_outage, on_recovered=self._nats_recovered)
        await claims.open()
        publisher = asyncio.create_task(self.relay.run(), name="allocator-outbox")
        tasks = [publisher]
        if self.estimator is not None:
            tasks.append(asyncio.create_task(self.estimator.run(), name="allocator-estimates"))
        log.info("allocator ready")
        next_cycle, cycle, fleet_changed = 0.0, self.cycle, self.inventory.changed
        try:
            while not self._stopping.is_set():
                interval = self.continue_after if cycle.work_left else self.cycle_interval
                messages = await claims.fetch(timeout=min(0.5, interval))
                self.backlog = len(messages) >= self.batch
                if self._stopping.is_set():
                    for message in messages:
                        await claims.nak(message, None)
                    break
                now = time.monotonic()
                due = fleet_changed.is_set() or ((cycle.waiting or cycle.work_left) and now >= next_cycle)
                if messages or due:
                    fleet_changed.clear()
                    next_cycle = now + (self.continue_after if cycle.work_left else self.cycle_interval)
                    async with claims.in_hand(messages):
                        await self.intake.take(messages)
                await self.pruner.run_if_due()  # between transactions: no decision waits on it
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(BaseException):  # it ends at its next await (an estimate's thread runs on)
                    await task
            if self._stopping.is_set():  # a clean stop publishes what committed, within a bound
                with contextlib.suppress(TimeoutError):  # publish_when_possible logs its own failures
                    await asyncio.wait_for(self.relay.publish_when_possible(), 5)

    async def _prepare_streams(self) -> None:
        """The contract's streams; and whether the status stream takes per-message TTLs (nats-server 2.11 and
        later, allow_msg_ttl)."""
        await ensure_streams(self.js)
        config = (await self.js.stream_info(subjects.STATUS_STREAM)).config
        self.relay.answers_expire = bool(config.allow_msg_ttl)

    async def _nats_recovered(self, lasted: float) -> None:
        await self._report(f"NATS was unreachable for {lasted:.0f}s", True)

    async def _report(self, why: str, resolved: bool) -> None:
        await publish_degraded(self.js, "allocator", why, log, resolved=resolved)


__all__ = ["Allocator"]
