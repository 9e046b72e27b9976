"""The clocks of waiting gangs (shared.admission.gangs: since when a gang has been complete, since when it
has been first in its tenant's order), one row per gang that has one running, so an allocator that starts
again counts on from where the last one was. The allocator reads them once, as it starts, and writes what
changed in its decision transaction (services/allocator/gang_clocks.py). Nothing here commits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlalchemy import delete, insert, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from shared.admission.gangs import GangKey, GangMark
from shared.ledger.schema import GangWait
from shared.ledger.unit_of_work import in_chunks


async def load(session: AsyncSession) -> dict[GangKey, GangMark]:
    """Every gang's clocks, by (tenant, gang)."""
    return {(tenant, gang): (complete, first) for tenant, gang, complete, first in await session.execute(
        select(GangWait.tenant, GangWait.gang, GangWait.complete_since, GangWait.first_since))}


async def write(session: AsyncSession, changed: Mapping[GangKey, GangMark], gone: Collection[GangKey]) -> None:
    """Rows for the gangs in `changed` (created or replaced), none for those in `gone`: a DELETE of both and
    an INSERT of the changed, the same on SQLite and PostgreSQL."""
    keys = [*changed, *gone]
    for chunk in in_chunks(keys):
        await session.execute(delete(GangWait).where(tuple_(GangWait.tenant, GangWait.gang).in_(chunk)))
    rows = [{"tenant": tenant, "gang": gang, "complete_since": complete, "first_since": first}
            for (tenant, gang), (complete, first) in changed.items()]
    if rows:
        await session.execute(insert(GangWait), rows)
