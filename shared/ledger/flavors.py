"""Custom flavors one row at a time, as the admin API edits them (a whole Quotas document goes through
quota_store). Nothing here commits or audits: the caller writes the audit entry in the same transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.quota_store import flavor_json
from shared.ledger.schema import Flavor as FlavorRow


async def flavor_rows(session: AsyncSession) -> dict[str, FlavorRow]:
    """The custom flavors (built-ins redefined included), by name."""
    return {row.name: row for row in await session.scalars(select(FlavorRow))}


async def flavor_row(session: AsyncSession, name: str) -> FlavorRow | None:
    return await session.get(FlavorRow, name)


async def put_flavor(session: AsyncSession, name: str, selector: str, value: float,
                     position: int | None) -> tuple[dict[str, Any] | None, FlavorRow]:
    """Create or replace. A new flavor without `position` goes last; an existing one keeps its place. The
    flavor's JSON before (None: it is new) and its row."""
    row = await session.get(FlavorRow, name)
    before = flavor_json(row) if row is not None else None
    if row is None:
        last = await session.scalar(select(func.max(FlavorRow.position)))
        row = FlavorRow(name=name, position=(last + 1) if last is not None else 0)
        session.add(row)
    row.selector, row.value = selector, value
    if position is not None:
        row.position = position
    return before, row


async def delete_flavor(session: AsyncSession, row: FlavorRow) -> None:
    await session.delete(row)
