"""The audit log: who changed which setting, with the entity's JSON before and after.

An entry is added to the caller's session, so it commits (or not) with the change it describes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.schema import AuditEntry


def record(session: AsyncSession, actor: str, action: str, entity: str,
           before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
    session.add(AuditEntry(actor=actor, action=action, entity=entity, before=before, after=after))


async def latest_entries(session: AsyncSession, limit: int, entity_prefix: str | None = None) -> list[AuditEntry]:
    """Newest first; with `entity_prefix`, only entities that start with it (taken literally: `%` and `_`
    match themselves)."""
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if entity_prefix:
        escaped = entity_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(AuditEntry.entity.like(f"{escaped}%", escape="\\"))
    return list(await session.scalars(query))
