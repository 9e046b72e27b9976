"""The allocator: read a claim message, decide with the pure core, commit, then ack, then publish.

Exactly-once effects: the message id goes into the inbox in the same transaction as the decision and
its outbox events. A redelivery (the process died between commit and ack) finds the id and only acks.
Two allocators racing for one device cannot both commit: device_allocations' primary key refuses the
second, whose transaction rolls back and whose message is redelivered and decided again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.allocator import ledger_ops as ops
from services.natsio import ensure_streams, publish_json
from shared import dra, events, subjects
from shared.allocation import SelectorMemo, State, settle
from shared.claims import InvalidClaim, read_submission
from shared.inventory import Fleet
from shared.ledger.engine import sessions
from shared.ledger.schema import OutboxEvent

log = logging.getLogger("claimbroker.allocator")
CONSUMER = "allocator"


class Allocator:
    def __init__(
        self,
        nc: Client,
        engine: AsyncEngine,
        classes: Mapping[str, dra.DeviceClass],
        *,
        batch: int = 64,
        ack_wait: float = 30.0,
        max_deliver: int = 10,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.sessions = sessions(engine)
        self.classes = dict(classes)
        self.fleet = Fleet()
        self.memo = SelectorMemo()
        self.batch = batch
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self._fleet_changed = asyncio.Event()
        self._inventory_seen = asyncio.Event()
        self._publish_lock = asyncio.Lock()
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Finish the message in hand, then return from run(); no transaction is cut in half."""
        self._stopping.set()

    async def run(self) -> None:
        """Rebuild from the ledger and the inventory stream, then serve until cancelled."""
        await ensure_streams(self.js)
        await self.publish_outbox()  # events committed before a crash but never published
        inventory = await self.js.subscribe(
            subjects.INVENTORY_ALL, stream=subjects.INVENTORY_STREAM, ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, cb=self._on_inventory,
        )
        claims = await self.js.pull_subscribe(
            subjects.PREFIX + ".claims.>", durable=CONSUMER, stream=subjects.CLAIMS_STREAM,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait, max_deliver=self.max_deliver,
                filter_subjects=[subjects.SUBMIT_ALL, subjects.RELEASE_ALL],
            ),
        )
        log.info("allocator ready")
        try:
            while not self._stopping.is_set():
                if self._fleet_changed.is_set():
                    self._fleet_changed.clear()
                    await self._retry_pending()
                try:
                    messages = await claims.fetch(self.batch, timeout=0.5)
                except NatsTimeout:
                    continue
                for message in messages:
                    if self._stopping.is_set():
                        await message.nak()
                        continue
                    await self._handle(message)
        finally:
            await inventory.unsubscribe()

    async def _on_inventory(self, message: Msg) -> None:
        try:
            node = events.read_inventory(json.loads(message.data))
        except (ValueError, dra.DocumentError) as error:
            log.warning("ignoring invalid inventory on %s: %s", message.subject, error)
            return
        current = self.fleet.nodes.get(node.node)
        if current is not None and node.sequence and current.sequence > node.sequence:
            return  # an older snapshot arriving late
        self.fleet = self.fleet.with_node(node)
        self._inventory_seen.set()
        self._fleet_changed.set()

    async def _handle(self, message: Msg) -> None:
        metadata = message.metadata
        message_id = (message.headers or {}).get("Nats-Msg-Id") or f"seq:{metadata.sequence.stream}"
        try:
            await self._decide_message(message, message_id)
        except (IntegrityError, DBAPIError) as error:
            # Another allocator committed first, or the database is busy: decide again later.
            log.warning("ledger refused %s (%s); redelivering", message_id, type(error).__name__)
            await message.nak(delay=0.2)
            return
        await message.ack_sync()
        await self.publish_outbox()

    async def _decide_message(self, message: Msg, message_id: str) -> None:
        async with self.sessions() as session, session.begin():
            if await ops.already_processed(session, CONSUMER, message_id):
                return
            ops.record_processed(session, CONSUMER, message_id)
            tenant = subjects.tenant_of(message.subject)
            if message.subject.startswith(subjects.PREFIX + ".claims.submit."):
                await self._submit(session, tenant, message.data, message_id)
            else:
                await self._release(session, tenant, message.data, message_id)

    async def _submit(self, session: Any, tenant: str, data: bytes, message_id: str) -> None:
        try:
            claim = read_submission(data, tenant)
        except InvalidClaim as invalid:
            await self._refuse(session, tenant, invalid, message_id)
            return
        row = await ops.find_claim(session, tenant, claim.metadata.name)
        if row is not None and row.state in (State.PENDING.value, State.ALLOCATED.value):
            return  # the same claim again: claims are immutable, the first one stands
        if row is not None:
            await session.delete(row)
            await session.flush()
        row = await ops.new_claim(session, claim)
        in_use = await ops.devices_in_use(session)
        [outcome] = settle([claim], self.fleet, self.classes, in_use, memo=self.memo)
        await ops.apply_decision(session, row, outcome.decision)
        ops.emit_status(session, row)

    async def _refuse(self, session: Any, tenant: str, invalid: InvalidClaim, message_id: str) -> None:
        if invalid.name is not None:
            row = await ops.find_claim(session, tenant, invalid.name)
            if row is not None and row.state in (State.PENDING.value, State.ALLOCATED.value):
                return  # never let a bad resubmission touch a good claim
            if row is None:
                row = ops.Claim(namespace=tenant, name=invalid.name, state=State.REJECTED.value, spec={},
                                sequence=0, priority=0, preemptible=True)
                session.add(row)
                await session.flush()
            row.state, row.reason, row.allocation, row.node = State.REJECTED.value, str(invalid), None, None
            ops.emit_status(session, row)
            return
        now = datetime.now(UTC).timestamp()
        ops.emit_event(
            session, subjects.alert("warning", "invalid-message"), f"alert:invalid:{message_id}",
            events.alert(
                kind="invalid-message", severity="warning", key=f"invalid-message:{tenant}",
                summary=f"a submission for tenant {tenant} could not be read as a claim: {invalid}",
                details={"tenant": tenant, "error": str(invalid), "messageId": message_id},
                labels={"tenant": tenant}, first_seen=now, last_seen=now,
            ),
        )

    async def _release(self, session: Any, tenant: str, data: bytes, message_id: str) -> None:
        try:
            body = json.loads(data)
            name = body["name"]
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            await self._refuse(session, tenant, InvalidClaim('release payload must be {"name": ...}'), message_id)
            return
        row = await ops.find_claim(session, tenant, name)
        if row is None or row.state not in (State.PENDING.value, State.ALLOCATED.value):
            return
        await ops.release_devices(session, row)
        row.state, row.reason, row.allocation, row.node = State.RELEASED.value, "released by the tenant", None, None
        ops.emit_status(session, row)
        await session.flush()
        await self._settle_pending(session)

    async def _settle_pending(self, session: Any) -> None:
        rows = await ops.pending_claims(session)
        if not rows:
            return
        in_use = await ops.devices_in_use(session)
        claims = [ops.claim_document(r) for r in rows]
        for row, outcome in zip(rows, settle(claims, self.fleet, self.classes, in_use, memo=self.memo),
                                strict=True):
            if await ops.apply_decision(session, row, outcome.decision):
                ops.emit_status(session, row)

    async def _retry_pending(self) -> None:
        try:
            async with self.sessions() as session, session.begin():
                await self._settle_pending(session)
        except (IntegrityError, DBAPIError) as error:
            log.warning("retry of pending claims refused (%s); will retry", type(error).__name__)
            self._fleet_changed.set()
            return
        await self.publish_outbox()

    async def publish_outbox(self) -> None:
        """Publish committed events in order; Nats-Msg-Id makes a re-publish after a crash harmless."""
        async with self._publish_lock:
            while True:
                # Read, publish, then mark in a second short transaction: no ledger lock is held while
                # we wait on NATS (SQLite has one writer), and a crash in between only re-publishes
                # events that JetStream then drops as duplicates.
                async with self.sessions() as session, session.begin():
                    rows = [(r.id, r.subject, r.payload, r.message_id) for r in await ops.unpublished(session)]
                if not rows:
                    return
                for _, subject, payload, message_id in rows:
                    await publish_json(self.js, subject, payload, msg_id=message_id)
                async with self.sessions() as session, session.begin():
                    await ops.mark_published(session, [row_id for row_id, *_ in rows])

    async def wait_for_inventory(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._inventory_seen.wait(), timeout)
        except TimeoutError:
            return False
        return True


__all__ = ["Allocator", "OutboxEvent"]
