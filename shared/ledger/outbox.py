"""The outbox: events committed with the decisions that caused them (written by the unit of work,
shared/ledger/unit_of_work.py), published once committed (read back in order, or handed over by the
transaction that wrote them) and marked once NATS has them. A crash between the two only publishes again
events that JetStream drops as duplicates (their Nats-Msg-Id)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update

from shared.ledger.schema import OutboxEvent
from shared.ledger.unit_of_work import UnitOfWork, in_chunks, one_of


@dataclass(frozen=True)
class Unpublished:
    """An event to publish: its row, subject, payload, Nats-Msg-Id, and how long JetStream keeps it (None:
    as long as the stream keeps any)."""

    id: int
    subject: str
    payload: Any
    message_id: str
    ttl_s: float | None


async def unpublished(work: UnitOfWork, limit: int = 500) -> list[Unpublished]:
    """The oldest events not marked published, in the order they were written."""
    rows = await work.session.execute(
        select(OutboxEvent.id, OutboxEvent.subject, OutboxEvent.payload, OutboxEvent.message_id, OutboxEvent.ttl_s)
        .where(OutboxEvent.published_at.is_(None)).order_by(OutboxEvent.id).limit(limit))
    return [Unpublished(*row) for row in rows]


def handed_over(rows: list[dict[str, Any]]) -> list[Unpublished]:
    """The rows a unit of work flushed (UnitOfWork.flushed), as events to publish; they carry no row id
    (mark them by message id)."""
    return [Unpublished(0, row["subject"], row["payload"], row["message_id"], row.get("ttl_s")) for row in rows]


async def mark_published(work: UnitOfWork, ids: list[int]) -> None:
    await work.session.execute(
        update(OutboxEvent).where(OutboxEvent.id.in_(ids)).values(published_at=datetime.now(UTC)))


async def mark_published_by_message_id(work: UnitOfWork, message_ids: list[str]) -> None:
    """Events published from memory: marked by their (unique) message ids, in chunks."""
    now = datetime.now(UTC)
    for chunk in in_chunks(message_ids):
        await work.session.execute(
            update(OutboxEvent).where(one_of(work.session, OutboxEvent.message_id, chunk)).values(published_at=now))
