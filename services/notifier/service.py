"""The notifier: claim statuses in, actionable alerts out on claimbroker.v1.alerts.<severity>.<kind>.

First version: claim-rejected at once, claim-pending-too-long after a configurable time (resolved
when the claim leaves Pending). Each alert has a stable key; a repeat of a key is not re-published.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig

from services.natsio import ensure_streams, publish_json
from shared import events, subjects

log = logging.getLogger("claimbroker.notifier")
CONSUMER = "notifier"


@dataclass
class _Pending:
    since: float
    reason: str
    alerted: bool = False


class Notifier:
    def __init__(
        self, nc: Client, *, pending_alert_after: float, clock: Callable[[], float] = time.time,
        check_interval: float | None = None,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.pending_alert_after = pending_alert_after
        self.clock = clock
        self.check_interval = check_interval or max(0.05, min(5.0, pending_alert_after / 4))
        self.pending: dict[str, _Pending] = {}
        self.fired: set[str] = set()

    async def run(self) -> None:
        await ensure_streams(self.js)
        statuses = await self.js.pull_subscribe(
            subjects.STATUS_ALL, durable=CONSUMER, stream=subjects.STATUS_STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_deliver=10),
        )
        log.info("notifier ready")
        next_check = self.clock() + self.check_interval
        while True:
            try:
                messages = await statuses.fetch(64, timeout=min(0.5, self.check_interval))
            except NatsTimeout:
                messages = []
            for message in messages:
                await self._on_status(message)
                await message.ack()
            if self.clock() >= next_check:
                await self.check_pending()
                next_check = self.clock() + self.check_interval

    async def _on_status(self, message: Msg) -> None:
        try:
            status = json.loads(message.data)
            claim = f"{status['namespace']}/{status['name']}"
            state = status["state"]
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable status on %s", message.subject)
            return
        reason = status.get("reason") or ""
        labels = {"tenant": status["namespace"], "claim": status["name"]}
        if state == "Rejected":
            await self._fire("claim-rejected", "warning", claim, f"claim {claim} was rejected: {reason}",
                             {"reason": reason, "sequence": status.get("sequence")}, labels)
        if state == "Pending":
            self.pending.setdefault(claim, _Pending(since=self.clock(), reason=reason)).reason = reason
            return
        waited = self.pending.pop(claim, None)
        if waited is not None and waited.alerted:
            await self._fire("claim-pending-too-long", "warning", claim,
                             f"claim {claim} is no longer pending ({state})",
                             {"state": state}, labels, resolved=True, first_seen=waited.since)

    async def check_pending(self) -> None:
        now = self.clock()
        for claim, entry in self.pending.items():
            if entry.alerted or now - entry.since < self.pending_alert_after:
                continue
            entry.alerted = True
            tenant, name = claim.split("/", 1)
            waited = now - entry.since
            await self._fire(
                "claim-pending-too-long", "warning", claim,
                f"claim {claim} has been pending for {waited:.0f}s (threshold {self.pending_alert_after:.0f}s): "
                f"{entry.reason}",
                {"reason": entry.reason, "pendingSeconds": round(waited, 1)},
                {"tenant": tenant, "claim": name}, first_seen=entry.since,
            )

    async def _fire(
        self, kind: str, severity: str, subject_key: str, summary: str, details: dict[str, object],
        labels: dict[str, str], *, resolved: bool = False, first_seen: float | None = None,
    ) -> None:
        key = f"{kind}:{subject_key}"
        if not resolved and key in self.fired:
            return
        if resolved:
            self.fired.discard(key)
        else:
            self.fired.add(key)
        now = self.clock()
        payload = events.alert(
            kind=kind, severity=severity, key=key, summary=summary, details=details, labels=labels,
            first_seen=first_seen or now, last_seen=now, resolved=resolved,
        )
        msg_id = f"alert:{key}:{'resolved' if resolved else 'open'}:{int(first_seen or now)}"
        await publish_json(self.js, subjects.alert(severity, kind), payload, msg_id=msg_id)


async def sleep_forever() -> None:
    await asyncio.Event().wait()
