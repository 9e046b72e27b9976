"""The notifier: claim statuses and inventory in, actionable alerts out on
claimbroker.v1.alerts.<severity>.<kind>, into the ledger's alert history and to webhooks.

Rules (shared/alerts/rules.py) turn inputs into raise/resolve actions; the AlertBook (shared/alerts/book.py)
folds repeats, rate-limits floods and decides what is published. Statuses come from a durable pull
consumer through the consumer shell (services/bus/consumer.Deliveries): a batch is acked only after the alert
history and the messages' inbox ids are committed (a redelivery finds its id and changes nothing), held
while the ledger is away, and handled one status at a time when it fails otherwise. Messages go out after
the commit with a Nats-Msg-Id made from their content, and on start rows written within JetStream's
duplicate window are published again, so a crash between commit and publish loses nothing and duplicates
nothing.

Every `usage_check_interval` (by self.clock; once at start) `check_usage` reads quota usage and pending
demand from the ledger and the fleet's flavors from inventory (services/notifier/usage.py), feeds
quota-near-limit and idle-larger-flavor, and writes the minute's usage sample (the usage page's fleet over
time). Those rules are levels, re-evaluated each pass: a condition
that still holds is not a new observation, so only its start and its end are published.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime

import httpx
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from services.bus.connection import BUS_ERRORS
from services.bus.consumer import Deliveries, PullConsumer, Unavailable
from services.bus.publish import publish_json
from services.bus.streams import DUPLICATE_WINDOW_S, ensure_streams
from services.notifier.usage import Figures, FleetFlavors, read_figures, waiting_for_mig
from services.notifier.webhooks import WebhookDispatcher
from services.runtime import metrics
from services.runtime.ledger_pruning import Pruner
from services.runtime.outage import Outage, publish_degraded, until_done
from shared.admission.mig_plan import plan_mig
from shared.alerts.book import Action, AlertBook, AlertPolicy, Message, Raise, Resolve, alert_key, apply
from shared.alerts.gangs import GANG_INCOMPLETE
from shared.alerts.rules import (
    IDLE_LARGER_FLAVOR,
    INVENTORY_STALE,
    NODE_LOST,
    PENDING_TOO_LONG,
    QUOTA_NEAR_LIMIT,
    ClaimRules,
    InventoryRules,
    MigAdviceRule,
    QuotaUsage,
    idle_larger_flavor,
    quota_near_limit,
)
from shared.contract import subjects
from shared.contract.messages import NodeInventory, UnreadableStatus, read_status
from shared.dra.classes import merge_classes
from shared.ledger import alerts, inbox, pending, tenants, usage_history
from shared.ledger.claims_read import read_claims
from shared.ledger.engine import sessions
from shared.ledger.errors import LEDGER_ERRORS
from shared.ledger.handles import AsyncEngine
from shared.ledger.quota_store import load_quota_config
from shared.settings import NotifierSettings, parse_duration

log = logging.getLogger("claimbroker.notifier")
CONSUMER = "notifier"
TENANT_REFRESH_S = 30.0
_LEVEL_KINDS = frozenset({QUOTA_NEAR_LIMIT, IDLE_LARGER_FLAVOR})


class Notifier:
    def __init__(
        self,
        engine: AsyncEngine,
        settings: NotifierSettings,
        *,
        clock: Callable[[], float] = time.time,
        check_interval: float | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.nc: Client  # both bound by run(): its FastStream app's connection
        self.js: JetStreamContext
        self.sessions = sessions(engine)
        self.settings = settings
        self.clock = clock
        # Parsed again: settings built with model_copy(update=...) (the CLI) skip validation, so '5m' may
        # still be a string here.
        pending_after, ttl = parse_duration(settings.pending_alert_after), parse_duration(settings.inventory_ttl)
        fold = parse_duration(settings.alert_fold_window)
        self._policy, self._pending_after = AlertPolicy(fold, settings.alert_rate_per_key,
                                                        settings.alert_rate_per_tenant), pending_after
        self.book = AlertBook(self._policy)
        self.claims = ClaimRules(pending_after)
        self._memory_stale = False  # a failed transaction's statuses were applied to book and claims
        self.fleet = InventoryRules(ttl)
        self.flavors = FleetFlavors(ttl)
        self.usage_interval = parse_duration(settings.usage_check_interval)
        self._usage_due = float("-inf")
        self.usage_checks = 0  # completed check_usage passes; tests wait on it
        self.mig_advice = (MigAdviceRule(settings.mig_advice_min, parse_duration(settings.mig_advice_window))
                           if settings.mig_advice_min > 0 else None)
        self.nats_outage = Outage("NATS", log)
        self.startup_outage = Outage("the ledger or NATS", log)  # restoring open alerts, at start
        # a batch of statuses is held while the ledger is away; one that fails otherwise is handled a status
        # at a time, and a status that still fails is redelivered after a second
        self.deliveries = Deliveries(self, log=log, max_deliver=settings.max_deliver,
                                     holding=Outage("the ledger", log), retry_delay=lambda _: 1.0,
                                     failing_delay=lambda _: 1.0)
        self.webhooks = WebhookDispatcher(settings.webhooks, self.sessions, attempts=settings.webhook_attempts,
                                          base_delay=settings.webhook_base_delay, client=http)
        shortest = min(pending_after, ttl, fold or 60.0)
        self.check_interval = check_interval or max(0.05, min(5.0, shortest / 4))
        self.handled = 0  # status and inventory messages processed; tests wait on it
        self._progress = asyncio.Condition()
        self._lock = asyncio.Lock()  # one writer of book, ledger and subjects at a time: ordered messages
        self._unpublished: list[Message] = []
        self._tenants_read_at = float("-inf")
        self.ready = asyncio.Event()
        self.pruner = Pruner(self.sessions, [inbox.pruning(CONSUMER)], parse_duration(settings.inbox_retention), clock)

    async def run(self, nc: Client, subscribe: Callable[[], Awaitable[object]]) -> None:
        """Restore open alerts from the ledger, then serve until cancelled. `subscribe` starts the app's
        inventory subscriber (services/bus/channels.py), which calls on_inventory."""
        self.nc, self.js = nc, nc.jetstream()
        await until_done(lambda: ensure_streams(self.js), self.nats_outage)
        await until_done(self._restore, self.startup_outage)
        self.webhooks.start()
        await until_done(subscribe, self.nats_outage)
        statuses = PullConsumer(self.nc, stream=subjects.STATUS_STREAM, durable=CONSUMER, subject=subjects.STATUS_ALL,
                                filter_subjects=[subjects.STATUS_ALL], ack_wait=self.settings.ack_wait,
                                max_deliver=self.settings.max_deliver, batch=256, log=log, outage=self.nats_outage)
        await statuses.open()
        await self._usage_if_due()
        log.info("notifier ready")
        self.ready.set()
        next_check = time.monotonic()  # the cadence is real time; what is due is decided by self.clock
        try:
            while True:
                messages = await statuses.fetch(timeout=min(0.5, self.check_interval))
                if self.nats_outage.since is not None:
                    continue  # NATS away: no checks either, their alerts could not go out
                if messages:
                    async with statuses.in_hand(messages):
                        await self.deliveries.deliver(messages)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.check_interval
                    try:
                        await self.tick()
                        await self._usage_if_due()
                        await self.pruner.run_if_due()  # the inbox's ids past their retention
                    except Exception as error:  # the loop's guard: a failed pass (the ledger or NATS away, or a
                        # rule's bug) must not end the notifier; the next check runs as planned
                        log.warning("alert checks failed (%s: %s); they run again in %.0fs", type(error).__name__,
                                    error, self.check_interval)
        finally:
            await self.webhooks.close()

    def not_ready(self) -> str | None:
        """Why it cannot turn statuses into alerts now (for /readyz), or None."""
        for outage in (self.nats_outage, self.startup_outage):
            if (why := outage.why()) is not None:
                return why
        return None

    # --- inputs -----------------------------------------------------------------------------------

    async def handle(self, messages: Sequence[Msg]) -> None:
        """A fetched batch of statuses in one transaction (one inbox read, one commit: a transaction per
        status cost the broker a third of its time under a burst). After a failed one, the alert book and
        the claim rules are first rebuilt from the ledger: they hold what it did not commit (applied again
        on redelivery, a raise would fold into itself and never be recorded or sent)."""
        if self._memory_stale and not await self._rebuild_memory():
            raise Unavailable("the alert state could not be rebuilt from the ledger")
        ids = [inbox.Key("status", "", f"status:{message.metadata.sequence.stream}") for message in messages]
        async with self._lock:
            sent: list[Message] = []
            async with self.sessions() as session, session.begin():
                done = await inbox.seen(session, CONSUMER, ids)
                recorded: list[inbox.Key] = []
                for message, message_id in zip(messages, ids, strict=True):
                    if message_id in done:
                        continue  # a redelivery, or the same status twice in this batch
                    produced = apply(self.book, self._status_actions(message), self.clock())
                    if produced:
                        # Only durable effects are guarded: a status that changed only memory (a
                        # folded repeat) is applied again after a crash, which is what rebuilds it.
                        sent.extend(produced)
                        recorded.append(message_id)
                        done.add(message_id)
                await alerts.record(session, sent)
                await inbox.record(session, CONSUMER, recorded, datetime.fromtimestamp(self.clock(), UTC))
            await self._publish(sent)

    # what the status consumer's shell asks of it (services/bus/consumer.Handler)

    async def after_failure(self, error: Exception) -> None:
        self._memory_stale = True

    async def dead_letter(self, message: Msg, error: Exception) -> bool:
        return False  # none: a status that cannot be recorded is redelivered until JetStream gives up

    async def degraded(self, error: Exception, *, unavailable: bool) -> None:
        await publish_degraded(self.js, "notifier", f"statuses not processed: {type(error).__name__}: "
                               f"{str(error)[:300]}", log)

    async def unhandled(self, error: Exception, message: Msg | None) -> None:
        log.error("status %s not processed; it will be redelivered",
                  message.metadata.sequence.stream if message is not None else "batch", exc_info=error)

    async def recovered(self) -> None:
        await publish_degraded(self.js, "notifier", "statuses processed again", log, resolved=True)

    async def settled(self, messages: Sequence[Msg]) -> None:
        await self._handled(len(messages))

    def _status_actions(self, message: Msg) -> list[Action]:
        try:
            return self.claims.on_status(read_status(message.data), self.clock())
        except UnreadableStatus:
            log.warning("ignoring unreadable status on %s", message.subject)
            return []

    async def on_inventory(self, inventory: NodeInventory) -> None:
        """One node's inventory, from the app's typed subscriber (an ordered consumer: no acks; on restart
        it replays the last message per node)."""
        try:
            payload = inventory.model_dump()
            self.flavors.on_inventory(payload)
            async with self._lock:
                now = self.clock()
                await self._commit_and_publish(apply(self.book, self.fleet.on_inventory(payload, now), now))
        except Exception:  # the subscriber's guard: one node's inventory must not stop the others'
            log.exception("inventory of node %s not processed", inventory.node)
        await self._handled()

    async def tick(self) -> list[Message]:
        """Time-driven rules and the book's fold windows; the loop calls it, tests may call it directly."""
        async with self._lock:
            now = self.clock()
            if now - self._tenants_read_at >= TENANT_REFRESH_S:
                await self._read_tenants(now)
            actions = [*self.claims.due(now), *self.fleet.due(now)]
            sent = apply(self.book, actions, now) + self.book.flush(now)
            retry, self._unpublished = self._unpublished, []
            await self._commit_and_publish(sent)
            await self._publish(retry, notify=True)
            return sent

    # --- hooks for rules whose inputs live elsewhere ---------------------------------------------

    async def evaluate_quotas(self, usages: Iterable[QuotaUsage], threshold: float = 0.9) -> list[Message]:
        """quota-near-limit: call with every tenant/flavor's figures (a missing pair is not resolved)."""
        return await self._evaluate(quota_near_limit(usages, threshold))

    async def evaluate_flavors(self, pending: Mapping[str, int], idle: Mapping[str, int],
                               values: Mapping[str, float]) -> list[Message]:
        """idle-larger-flavor: pending demand and idle devices per flavor, and each flavor's value."""
        return await self._evaluate(idle_larger_flavor(pending, idle, values))

    async def check_usage(self) -> list[Message]:
        """One pass of the ledger-driven rules; the loop calls it every `usage_check_interval`, tests may
        call it directly. A quota deleted from the ledger ends its alert: its pair is no longer listed."""
        self._usage_due = self.clock() + self.usage_interval
        async with self.sessions() as session:
            figures = await read_figures(session, self.flavors, self.clock())
        await self._sample(figures)
        listed = {alert_key(QUOTA_NEAR_LIMIT, u.tenant, u.flavor) for u in figures.usages}
        gone = [Resolve(key, "its quota is no longer configured") for key in self.book.open_keys()
                if key.startswith(f"{QUOTA_NEAR_LIMIT}:") and key not in listed]
        sent = await self.evaluate_quotas(figures.usages) + await self._evaluate(gone)
        sent += await self.evaluate_flavors(figures.pending, figures.idle, figures.values)
        if self.mig_advice is not None:
            sent += await self._evaluate(await self._mig_advice())
        async with self._progress:
            self.usage_checks += 1
            self._progress.notify_all()
        return sent

    async def _sample(self, figures: Figures) -> None:
        """This minute's usage sample for the page's fleet over time; a failure costs a point of the chart,
        never the pass's alerts."""
        nominal = {(u.tenant, u.flavor): u.nominal for u in figures.usages}
        try:
            async with self.sessions() as session, session.begin():
                await usage_history.record(session, self.clock(), figures.used, nominal, figures.capacity)
        except LEDGER_ERRORS:
            log.exception("usage sample not written; the next pass tries again")

    async def _mig_advice(self) -> list[Action]:
        """mig-relayout-suggested: a plan only while claims for a MIG device wait (planning weighs every
        idle GPU's layouts, a cycle each: off the event loop)."""
        assert self.mig_advice is not None
        async with self.sessions() as session:
            if not await waiting_for_mig(session):
                return self.mig_advice.on_plan(0, [], self.clock())
            running, waiting, _ = await read_claims(session)
            config = await load_quota_config(session)
        fleet = self.flavors.fleet(self.clock())
        plan = await asyncio.to_thread(plan_mig, fleet, merge_classes([]), config, running, waiting)
        return self.mig_advice.on_plan(len(plan.gained), plan.to_json()["layouts"], self.clock())

    async def _usage_if_due(self) -> None:
        if self.clock() < self._usage_due:
            return
        try:
            await self.check_usage()
        except LEDGER_ERRORS:
            log.exception("quota usage not checked; trying again in %.0fs", self.usage_interval)

    async def _evaluate(self, actions: Sequence[Action]) -> list[Message]:
        async with self._lock:
            now = self.clock()
            # Level rules (quota, flavor) raise on every pass while their condition holds: only the
            # first raise of an episode is news, the rest would count checks, not occurrences.
            actions = [a for a in actions if not (isinstance(a, Raise) and a.alert.kind in _LEVEL_KINDS
                                                  and self.book.is_open(a.alert.key))]
            sent = apply(self.book, actions, now)
            await self._commit_and_publish(sent)
            return sent

    # --- effects ----------------------------------------------------------------------------------

    async def _commit_and_publish(self, sent: list[Message]) -> None:
        if not sent:
            return
        async with self.sessions() as session, session.begin():
            await alerts.record(session, sent)
        await self._publish(sent)

    async def _publish(self, sent: Sequence[Message], *, notify: bool = True) -> None:
        for index, message in enumerate(sent):
            alert = message.alert
            try:
                await publish_json(self.js, subjects.alert(alert.severity, alert.kind, alert.tenant), message.payload,
                                   msg_id=message.msg_id)
            except BUS_ERRORS:
                log.exception("alert %s not published; will retry", message.msg_id)
                self._unpublished.extend(sent[index:])
                return
            resolved = "true" if message.payload.get("resolved") else "false"
            metrics.ALERTS_SENT.labels(alert.kind, alert.severity, resolved).inc()
            if notify:
                self.webhooks.submit(message)

    async def _handled(self, count: int = 1) -> None:
        async with self._progress:
            self.handled += count
            self._progress.notify_all()

    async def wait_handled(self, count: int, timeout: float = 20.0) -> None:
        """Until `count` input messages have been processed (tests use it instead of sleeping)."""
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(lambda: self.handled >= count), timeout)

    async def wait_usage_checks(self, count: int, timeout: float = 20.0) -> None:
        """Until `count` check_usage passes have completed (the first runs before `ready`)."""
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(lambda: self.usage_checks >= count), timeout)

    async def _read_tenants(self, now: float) -> None:
        try:
            async with self.sessions() as session:
                self.claims.thresholds = await tenants.pending_alert_after(session)
            self._tenants_read_at = now
        except LEDGER_ERRORS:
            log.exception("tenant thresholds not read; keeping the last ones")

    async def _rebuild_memory(self) -> bool:
        """The alert book and the claim rules as the ledger has them (what a restart reads); False while
        the ledger cannot be read."""
        async with self._lock:
            book, claims = self.book, self.claims
            self.book, self.claims = AlertBook(self._policy), ClaimRules(self._pending_after)
            self.claims.thresholds = claims.thresholds  # per tenant, read from the ledger on their own cadence
            try:
                await self._load_memory()
            except LEDGER_ERRORS as error:  # the ledger is away: try again with the next batch
                self.book, self.claims = book, claims
                log.warning("alert state not rebuilt from the ledger yet (%s)", type(error).__name__)
                return False
            self._memory_stale = False
            return True

    async def _load_memory(self) -> None:
        """Open alerts and waiting claims from the ledger into the book and the claim rules."""
        async with self.sessions() as session:
            open_alerts = await alerts.open_alerts(session)
            waiting = await pending.waiting_since(session)
        for message in open_alerts:
            self.book.restore(message.alert, first_seen=message.first_seen, last_seen=message.last_seen,
                              count=message.count)
        # a node that came back, or was heard again, while the notifier was away: its replayed last message
        # resolves the alert, as a live one would have
        nodes = [(m.alert.kind, m.alert.labels.get("node")) for m in open_alerts]
        self.fleet.seed(stale=[node for kind, node in nodes if kind == INVENTORY_STALE and node],
                        lost=[node for kind, node in nodes if kind == NODE_LOST and node])
        for tenant, name, since, reason in waiting:
            alerted = self.book.is_open(alert_key(PENDING_TOO_LONG, tenant, name))
            self.claims.seed(tenant, name, since=since, reason=reason, alerted=alerted)
        # a gang whose members no longer wait for members (complete, or gone) while the notifier was away:
        # the next tick resolves its alert
        for message in open_alerts:
            labels = message.alert.labels
            if message.alert.kind == GANG_INCOMPLETE and labels.get("tenant") and labels.get("gang"):
                self.claims.seed_gang_alert(labels["tenant"], labels["gang"])

    async def _restore(self) -> None:
        """Open alerts and waiting claims from the ledger, and a re-publish of recent messages that a
        crash may have kept from NATS (JetStream drops the ones it already has)."""
        now = self.clock()
        await self._load_memory()
        async with self.sessions() as session:
            recent = await alerts.changed_since(session, now - DUPLICATE_WINDOW_S)
        await self._read_tenants(now)
        await self._publish(recent, notify=False)
