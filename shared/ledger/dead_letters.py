"""What could not be delivered, kept for an operator: messages a consumer could not commit even on their
own (read here a page at a time), and webhook deliveries that failed every attempt.

Nothing here commits; the caller's transaction does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.schema import DeadLetter, WebhookDeadLetter

HEAD_BYTES = 8000  # what a listing reads of a payload, which may be a megabyte


@dataclass(frozen=True)
class DeadLetterHead:
    """A dead letter with the first HEAD_BYTES of its payload."""

    id: int
    consumer: str
    message_id: str
    subject: str
    payload_size: int
    payload_head: bytes
    error: str
    deliveries: int
    created_at: datetime


async def latest_dead_letters(session: AsyncSession, limit: int) -> list[DeadLetterHead]:
    """Newest first."""
    head = func.substr(DeadLetter.payload, 1, HEAD_BYTES).label("head")
    rows = await session.execute(select(DeadLetter.id, DeadLetter.consumer, DeadLetter.message_id, DeadLetter.subject,
                                        DeadLetter.payload_size, head, DeadLetter.error, DeadLetter.deliveries,
                                        DeadLetter.created_at).order_by(DeadLetter.id.desc()).limit(limit))
    return [DeadLetterHead(r.id, r.consumer, r.message_id, r.subject, r.payload_size, bytes(r.head), r.error,
                           r.deliveries, r.created_at) for r in rows]


def keep_webhook_delivery(session: AsyncSession, *, url: str, alert_key: str, payload: dict[str, Any], attempts: int,
                          last_error: str) -> None:
    """A webhook delivery that failed its last attempt, with the error (its first 2,000 characters)."""
    session.add(WebhookDeadLetter(url=url, alert_key=alert_key, payload=payload, attempts=attempts,
                                  last_error=last_error[:2000]))
