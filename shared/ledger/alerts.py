"""Alert history: one row per episode (key and first seen), holding what its latest message said. The
notifier writes it and reads back what is open; the admin API lists and counts it.

Nothing here commits; the caller's transaction does. Times are stored as aware UTC datetimes; SQLite
hands them back naive, so every read goes through `_ts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.alerts.book import Alert, Message
from shared.ledger.schema import AlertRecord


def to_dt(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


def _ts(moment: datetime) -> float:
    return (moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment).timestamp()


async def record(session: AsyncSession, messages: Sequence[Message]) -> None:
    """Upsert by (key, firstSeen): a row is an episode, and holds what its latest message said."""
    for message in messages:
        alert, first = message.alert, to_dt(message.first_seen)
        row = await session.scalar(
            select(AlertRecord).where(AlertRecord.key == alert.key, AlertRecord.first_seen == first))
        if row is None:
            row = AlertRecord(key=alert.key, first_seen=first)
            session.add(row)
        row.kind, row.severity, row.tenant = alert.kind, alert.severity, alert.tenant
        row.summary, row.details, row.labels = alert.summary, dict(alert.details), dict(alert.labels)
        row.last_seen, row.count, row.resolved = to_dt(message.last_seen), message.count, message.resolved
        row.resolved_at = to_dt(message.last_seen) if message.resolved else None
        await session.flush()  # a second message of the same episode in this transaction finds the row


def message_of(row: AlertRecord) -> Message:
    alert = Alert(row.kind, row.severity, row.key, row.summary, dict(row.details), dict(row.labels))
    return Message(alert, _ts(row.first_seen), _ts(row.last_seen), row.count, row.resolved)


async def open_alerts(session: AsyncSession) -> list[Message]:
    rows = await session.scalars(select(AlertRecord).where(AlertRecord.resolved.is_(False))
                                 .order_by(AlertRecord.id))
    return [message_of(r) for r in rows]


async def changed_since(session: AsyncSession, since: float) -> list[Message]:
    """Rows written recently: after a crash some of them may not have reached NATS."""
    moment = to_dt(since)
    rows = await session.scalars(select(AlertRecord).where(
        or_(AlertRecord.last_seen >= moment, AlertRecord.resolved_at >= moment)).order_by(AlertRecord.id))
    return [message_of(r) for r in rows]


async def latest_alerts(session: AsyncSession, limit: int, *, tenant: str | None = None, kind: str | None = None,
                        resolved: bool | None = None) -> list[AlertRecord]:
    """Newest first (by last seen). With `tenant`, that tenant's only: fleet-wide alerts name none."""
    query = select(AlertRecord).order_by(AlertRecord.last_seen.desc(), AlertRecord.id.desc()).limit(limit)
    if tenant is not None:
        query = query.where(AlertRecord.tenant == tenant)
    if kind:
        query = query.where(AlertRecord.kind == kind)
    if resolved is not None:
        query = query.where(AlertRecord.resolved == resolved)
    return list(await session.scalars(query))


@dataclass(frozen=True)
class OpenCount:
    kind: str
    severity: str
    tenant: str | None
    flavor: str | None  # the alerts' `flavor` label
    open: int
    last_seen: datetime


async def open_counts(session: AsyncSession, tenant: str | None = None) -> list[OpenCount]:
    """Open alerts counted per kind, severity, tenant and flavor label, in the ledger: ten thousand of them
    are a few rows. With `tenant`, that tenant's only."""
    flavor = AlertRecord.labels["flavor"].as_string()
    query = (select(AlertRecord.kind, AlertRecord.severity, AlertRecord.tenant, flavor, func.count(),
                    func.max(AlertRecord.last_seen))
             .where(AlertRecord.resolved.is_(False))
             .group_by(AlertRecord.kind, AlertRecord.severity, AlertRecord.tenant, flavor))
    if tenant is not None:
        query = query.where(AlertRecord.tenant == tenant)
    return [OpenCount(kind, severity, row_tenant, flavor_name, n, last)
            for kind, severity, row_tenant, flavor_name, n, last in await session.execute(query)]
