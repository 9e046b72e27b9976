"""The inbox: the ids of the stream messages whose effects a consumer has committed. A consumer reads it
and writes it in the same transaction as the effects, so a redelivered or re-sent message finds its id and
changes nothing (exactly-once effects on an at-least-once stream). One implementation for every consumer of
the broker (the allocator's claims, the notifier's statuses).

An id counts within its kind of message and its tenant (`Key`): one tenant's `Nats-Msg-Id` never hides
another's, nor a release a submission that used the same id. JetStream's own duplicate window cannot be
scoped so (it is one per stream), which is why the inbox, not JetStream, is what makes a re-sent message
change nothing. Ids are kept for a retention and pruned (`prune`), far longer than any redelivery takes.

Rows written before ids were scoped carry the kind LEGACY and no tenant: such a row still counts for every
kind and tenant (what JetStream's window did then), until it is pruned."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import ARRAY, DateTime, String, bindparam, delete, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.schema import DEAD_LETTER_PAYLOAD_LIMIT, DeadLetter, InboxMessage
from shared.ledger.unit_of_work import one_of

_IDS_PER_QUERY = 500  # bound parameters per statement stay far below every driver's limit
LEGACY = ""  # the kind of a row written before ids were scoped: it matches its id of any kind and tenant


class Key(NamedTuple):
    """What a message's id counts within: its kind (`submit`, `release`, `status`...), its tenant ('' for
    a consumer whose ids are the stream's own sequences) and the id."""

    kind: str
    tenant: str
    message_id: str


async def seen(session: AsyncSession, consumer: str, keys: Iterable[Key]) -> set[Key]:
    """Which of these messages the inbox holds: a query per 500 ids, not one per message. Asked by id
    alone (the primary key's prefix), the few rows of other kinds and tenants dropped here."""
    wanted = set(keys)
    ids = sorted({key.message_id for key in wanted})
    held = set[tuple[str, str, str]]()
    for start in range(0, len(ids), _IDS_PER_QUERY):
        held.update((kind, tenant, message_id) for kind, tenant, message_id in await session.execute(
            select(InboxMessage.kind, InboxMessage.tenant, InboxMessage.message_id).where(
                InboxMessage.consumer == consumer,
                one_of(session, InboxMessage.message_id, ids[start:start + _IDS_PER_QUERY]))))
    return {key for key in wanted if key in held or (LEGACY, "", key.message_id) in held}


async def record(session: AsyncSession, consumer: str, keys: Iterable[Key], at: datetime) -> None:
    """These messages' effects commit with this transaction, at `at` (the consumer's clock, which its
    pruning reads too): one statement for them all."""
    rows = [{"consumer": consumer, "kind": key.kind, "tenant": key.tenant, "message_id": key.message_id,
             "processed_at": at} for key in dict.fromkeys(keys)]
    if rows:
        await session.execute(insert(InboxMessage), rows)


# The inbox's check and record in one statement on PostgreSQL: the keys no row holds (by kind and tenant, nor
# by a LEGACY row of their id) are inserted and returned; the others were seen.
_RECORD_UNSEEN = text("""
WITH incoming AS (
    SELECT DISTINCT kind, tenant, message_id
    FROM unnest(CAST(:kinds AS varchar[]), CAST(:tenants AS varchar[]), CAST(:ids AS varchar[]))
        AS i(kind, tenant, message_id))
INSERT INTO inbox (consumer, message_id, kind, tenant, processed_at)
SELECT CAST(:consumer AS varchar), i.message_id, i.kind, i.tenant, CAST(:at AS timestamptz) FROM incoming i
WHERE NOT EXISTS (SELECT 1 FROM inbox l WHERE l.consumer = CAST(:consumer AS varchar) AND l.message_id = i.message_id
                  AND l.kind = '' AND l.tenant = '')
ON CONFLICT DO NOTHING
RETURNING kind, tenant, message_id""").bindparams(
    bindparam("kinds", type_=ARRAY(String)), bindparam("tenants", type_=ARRAY(String)),
    bindparam("ids", type_=ARRAY(String)), bindparam("at", type_=DateTime(timezone=True)))


async def record_unseen(session: AsyncSession, consumer: str, keys: Iterable[Key], at: datetime) -> set[Key]:
    """`seen` and `record` of the keys not seen, in one: which of these keys the inbox did not hold, now
    recorded (at `at`); the others it held. On PostgreSQL one statement (INSERT ... ON CONFLICT DO NOTHING
    RETURNING: the check and the record were two round trips of every decision transaction, issue 42)."""
    wanted = list(dict.fromkeys(keys))
    if not wanted:
        return set()
    if session.get_bind().dialect.name != "postgresql":
        held = await seen(session, consumer, wanted)
        unseen = [key for key in wanted if key not in held]
        await record(session, consumer, unseen, at)
        return set(unseen)
    rows = await session.execute(_RECORD_UNSEEN, {
        "kinds": [key.kind for key in wanted], "tenants": [key.tenant for key in wanted],
        "ids": [key.message_id for key in wanted], "consumer": consumer, "at": at})
    return {Key(kind, tenant, message_id) for kind, tenant, message_id in rows}


async def prune(session: AsyncSession, consumer: str, before: datetime, limit: int) -> int:
    """Forget the consumer's ids recorded before `before`, about `limit` of them, oldest first; returns how
    many went. A range of the processed_at index: where the limit-th oldest row falls, then every row up
    to it (rows of one transaction share their time), so each call is one short transaction; the caller
    calls again while a batch comes back full."""
    oldest = (select(InboxMessage.processed_at)
              .where(InboxMessage.consumer == consumer, InboxMessage.processed_at < before)
              .order_by(InboxMessage.processed_at).limit(limit).subquery())
    cutoff = await session.scalar(select(func.max(oldest.c.processed_at)))
    if cutoff is None:
        return 0
    result = await session.execute(
        delete(InboxMessage).where(InboxMessage.consumer == consumer, InboxMessage.processed_at <= cutoff,
                                   InboxMessage.processed_at < before)
        .execution_options(synchronize_session=False))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def set_aside(session: AsyncSession, consumer: str, key: Key, *, subject: str, data: bytes, error: str,
                    deliveries: int, at: datetime) -> bool:
    """Keep a message whose effects could not be committed, with its error, in the dead letters (its payload
    cut at DEAD_LETTER_PAYLOAD_LIMIT), and record it handled; False when the inbox holds it already (set
    aside before, or committed after all)."""
    if await seen(session, consumer, [key]):
        return False
    await record(session, consumer, [key], at)
    session.add(DeadLetter(consumer=consumer, message_id=key.message_id, subject=subject,
                           payload=data[:DEAD_LETTER_PAYLOAD_LIMIT], payload_size=len(data), error=error,
                           deliveries=deliveries))
    return True


def pruning(consumer: str) -> Callable[[AsyncSession, datetime, int], Awaitable[int]]:
    """`prune` of the consumer's ids, as services/runtime/ledger_pruning.Pruner calls it."""
    async def prune_consumer(session: AsyncSession, before: datetime, limit: int) -> int:
        return await prune(session, consumer, before, limit)
    return prune_consumer
