"""The inbox: the ids of the stream messages whose effects a consumer has committed. A consumer reads it
and writes it in the same transaction as the effects, so a redelivered or duplicated message finds its id
and changes nothing (exactly-once effects on an at-least-once stream). One implementation for every
consumer of the broker (the allocator's claims, the notifier's statuses)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.schema import InboxMessage

_IDS_PER_QUERY = 500  # bound parameters per statement stay far below every driver's limit


async def seen(session: AsyncSession, consumer: str, message_ids: Iterable[str]) -> set[str]:
    """Which of these messages the inbox holds: a query per 500 ids, not one per message."""
    wanted = sorted(set(message_ids))
    found = set[str]()
    for start in range(0, len(wanted), _IDS_PER_QUERY):
        found.update(await session.scalars(select(InboxMessage.message_id).where(
            InboxMessage.consumer == consumer, InboxMessage.message_id.in_(wanted[start:start + _IDS_PER_QUERY]))))
    return found


async def record(session: AsyncSession, consumer: str, message_ids: Iterable[str]) -> None:
    """These messages' effects commit with this transaction: one statement for them all."""
    rows = [{"consumer": consumer, "message_id": message_id} for message_id in dict.fromkeys(message_ids)]
    if rows:
        await session.execute(insert(InboxMessage), rows)
