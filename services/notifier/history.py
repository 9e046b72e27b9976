"""The notifier's reads and writes in the ledger: alert history, its inbox, tenants, dead letters.

Nothing here commits; the caller's transaction does. Times are stored as aware UTC datetimes; SQLite
hands them back naive, so every read goes through `_ts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.alerts.book import Alert, Message
from shared.ledger.schema import AlertRecord, Claim, Tenant, WebhookDeadLetter


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


async def tenant_thresholds(session: AsyncSession) -> dict[str, float]:
    rows = await session.execute(select(Tenant.name, Tenant.pending_alert_after_s)
                                 .where(Tenant.pending_alert_after_s.is_not(None)))
    return {name: float(after) for name, after in rows if after is not None}


async def waiting_claims(session: AsyncSession) -> list[tuple[str, str, float, str]]:
    """(tenant, name, since, reason) of Pending claims, so a restart does not forget who waits."""
    rows = await session.execute(select(Claim.namespace, Claim.name, Claim.updated_at, Claim.reason)
                                 .where(Claim.state == "Pending"))
    return [(ns, name, _ts(updated), reason or "") for ns, name, updated, reason in rows]


def dead_letter(session: AsyncSession, *, url: str, alert_key: str, payload: dict[str, Any], attempts: int,
                last_error: str) -> None:
    session.add(WebhookDeadLetter(url=url, alert_key=alert_key, payload=payload, attempts=attempts,
                                  last_error=last_error[:2000]))
