"""What a decision cycle reads of the claims it decides, and what it frees: the rows its decisions are
written to (`claim_rows`, as plain columns; the unit of work writes them back in bulk, with their devices,
history and statuses) and the devices of claims that no longer hold them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields

from sqlalchemy import delete, select

from shared.ledger.queue import Queue
from shared.ledger.schema import Claim, DeviceAllocation
from shared.ledger.unit_of_work import ClaimRow, UnitOfWork, in_chunks

_ROW_FIELDS = tuple(f.name for f in fields(ClaimRow) if f.name != "explain")
_ROW_COLUMNS = tuple(getattr(Claim, name) for name in _ROW_FIELDS)


async def claim_rows(work: UnitOfWork, queue: Queue,
                     keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], ClaimRow]:
    """The ledger rows of these queued claims, to write a cycle's decisions to (read in bulk, as plain
    columns: a decision replaces the explanation and does not read the document)."""
    wanted = {queue.ids[key]: key for key in keys}
    rows: dict[tuple[str, str], ClaimRow] = {}
    for chunk in in_chunks(sorted(wanted)):
        for values in await work.session.execute(select(*_ROW_COLUMNS).where(Claim.id.in_(chunk))):
            rows[wanted[values[0]]] = ClaimRow(**dict(zip(_ROW_FIELDS, values, strict=True)))
    return rows


async def release_devices(work: UnitOfWork, claim_ids: Iterable[int]) -> None:
    """The devices these claim rows hold go back, in one statement per chunk."""
    for chunk in in_chunks(sorted(set(claim_ids))):
        await work.session.execute(delete(DeviceAllocation).where(DeviceAllocation.claim_id.in_(chunk)))
