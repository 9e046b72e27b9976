"""Webhook sinks: one queue and one worker per sink, so a slow or failing receiver holds up neither NATS
consumption nor the other sinks. Retries back off exponentially; after the last attempt the delivery is
kept as a dead-letter row in the ledger rather than dropped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import stamina

from services.runtime import metrics
from services.runtime.logs import url_origin
from shared.alerts.book import Message, severity_rank
from shared.ledger.dead_letters import keep_webhook_delivery
from shared.ledger.handles import SessionFactory
from shared.settings import Webhook

log = logging.getLogger("claimbroker.notifier.webhooks")
QUEUE_LIMIT = 10_000
_ICONS = {"critical": ":red_circle:", "warning": ":warning:", "info": ":information_source:"}


def slack_body(payload: dict[str, Any]) -> dict[str, Any]:
    """Slack's incoming-webhook shape: `text` for notifications and old clients, `blocks` for the rest."""
    state = "RESOLVED" if payload["resolved"] else str(payload["severity"]).upper()
    icon = ":white_check_mark:" if payload["resolved"] else _ICONS.get(payload["severity"], "")
    repeats = f" (×{payload['count']})" if payload["count"] > 1 else ""
    text = f"[{state}] {payload['kind']}: {payload['summary']}{repeats}"
    labels = " · ".join(f"{k}={v}" for k, v in sorted(payload["labels"].items()))
    context = (f"key `{payload['key']}` · count {payload['count']} · first seen {payload['firstSeen']} · "
               f"last seen {payload['lastSeen']}" + (f" · {labels}" if labels else ""))
    return {"text": text, "blocks": [
        {"type": "section", "text": {"type": "mrkdwn",
                                     "text": f"{icon} *{state}* `{payload['kind']}`\n{payload['summary']}"}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
    ]}


class _Refused(Exception):
    """The receiver answered, but not with success: retried like a network error."""


@dataclass(frozen=True)
class _Delivery:
    key: str
    msg_id: str
    payload: dict[str, Any]


class WebhookDispatcher:
    def __init__(
        self,
        sinks: Sequence[Webhook],
        sessions: SessionFactory,
        *,
        attempts: int = 5,
        base_delay: float = 0.5,
        client: httpx.AsyncClient | None = None,
        max_delay: float = 60.0,
        timeout: float = 10.0,
    ) -> None:
        self.sinks = list(sinks)
        self.sessions = sessions
        self.attempts = max(1, attempts)
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._own_client = client is None
        self.client = client or httpx.AsyncClient(timeout=timeout)
        self._queues: list[asyncio.Queue[_Delivery]] = [asyncio.Queue(QUEUE_LIMIT) for _ in self.sinks]
        self._workers: list[asyncio.Task[None]] = []
        self.delivered = 0
        self.dead_letters = 0

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work(sink, queue), name=f"webhook-{i}")
                         for i, (sink, queue) in enumerate(zip(self.sinks, self._queues, strict=True))]

    def submit(self, message: Message) -> None:
        """Never blocks: the caller is the NATS consumer."""
        delivery = _Delivery(message.alert.key, message.msg_id, message.payload)
        for sink, queue in zip(self.sinks, self._queues, strict=True):
            if severity_rank(message.alert.severity) < severity_rank(sink.min_severity):
                continue
            try:
                queue.put_nowait(delivery)
            except asyncio.QueueFull:
                log.error("webhook queue for %s is full; dropping %s", url_origin(sink.url), message.msg_id)
                metrics.WEBHOOK_FAILURES.labels(httpx.URL(sink.url).host).inc()

    async def join(self) -> None:
        """Wait until every submitted delivery has succeeded or been dead-lettered."""
        for queue in self._queues:
            await queue.join()

    async def close(self) -> None:
        for worker in self._workers:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        if self._own_client:
            await self.client.aclose()

    async def _work(self, sink: Webhook, queue: asyncio.Queue[_Delivery]) -> None:
        while True:
            delivery = await queue.get()
            try:
                await self._deliver(sink, delivery)
            except Exception:  # a worker must outlive any one delivery
                log.exception("webhook delivery to %s failed unexpectedly", url_origin(sink.url))
            finally:
                queue.task_done()

    async def _deliver(self, sink: Webhook, delivery: _Delivery) -> None:
        body = slack_body(delivery.payload) if sink.format == "slack" else delivery.payload
        # Receivers that dedupe can use the same id JetStream uses.
        headers = {"Idempotency-Key": delivery.msg_id}
        try:  # stamina: exponential backoff from base_delay, jittered by as much again, within max_delay
            async for attempt in stamina.retry_context(
                    on=(httpx.HTTPError, _Refused), attempts=self.attempts, timeout=None,
                    wait_initial=self.base_delay, wait_jitter=self.base_delay, wait_max=self.max_delay):
                with attempt:
                    response = await self.client.post(sink.url, json=body, headers=headers)
                    if not response.is_success:
                        raise _Refused(f"HTTP {response.status_code}: {response.text[:200]}")
            self.delivered += 1
            return
        except (httpx.HTTPError, _Refused) as failure:
            error = str(failure) if isinstance(failure, _Refused) else f"{type(failure).__name__}: {failure}"
        log.warning("webhook %s failed %d times (%s); dead-lettered %s", url_origin(sink.url), self.attempts, error,
                    delivery.key)
        metrics.WEBHOOK_FAILURES.labels(httpx.URL(sink.url).host).inc()  # the host: a Slack URL's path is its secret
        async with self.sessions() as session, session.begin():
            keep_webhook_delivery(session, url=sink.url, alert_key=delivery.key, payload=body,
                                  attempts=self.attempts, last_error=error)
        self.dead_letters += 1
