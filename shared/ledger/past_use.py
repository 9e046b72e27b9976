"""Past use in the ledger (contract, Quotas: `fairSharing.halfLife`; the arithmetic is
shared/admission/past_use.py): one row per tenant and flavor, its GPU units as of a time, written by the
allocator in its decision transaction so that a restart goes on from it rather than from nothing.

`PastUseKeeper` is the allocator's: it reads the rows once, then keeps past use in memory and steps it at
every decision transaction with the units held since the last step, so use is counted while claims are
held even when no cycle runs (kueue#15383); it writes the rows back at most every `write_every` seconds.
`past_use_now` is for readers outside the allocator (the usage views, whatif, the estimator's process):
the rows brought up to now with what the ledger says is held.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from shared.admission.past_use import NEGLIGIBLE, PastUse, bring_up_to, decay_factor
from shared.ledger.schema import Claim, DeviceAllocation
from shared.ledger.schema import PastUse as PastUseRow

WRITE_EVERY = 5.0  # seconds between writes of the rows: a restart loses at most this much of the step


@dataclass(frozen=True)
class Kept:
    """Past use as of `as_of` (None: none known yet), and the GPU units held since then per tenant and flavor."""

    past: PastUse = field(default_factory=dict)
    as_of: float | None = None
    held: PastUse = field(default_factory=dict)


async def read_rows(session: AsyncSession, half_life: float) -> tuple[dict[tuple[str, str], float], float | None]:
    """The rows as one past use at the latest as_of among them (a row written earlier is decayed to it with
    nothing held meanwhile, as a row dropped for being negligible would be), and that as_of."""
    rows = [(tenant, flavor, float(units), float(as_of)) for tenant, flavor, units, as_of in await session.execute(
        select(PastUseRow.tenant, PastUseRow.flavor, PastUseRow.units, PastUseRow.as_of)
        .order_by(PastUseRow.tenant, PastUseRow.flavor))]
    if not rows:
        return {}, None
    latest = max(as_of for *_, as_of in rows)
    return {(tenant, flavor): units * decay_factor(latest - as_of, half_life)
            for tenant, flavor, units, as_of in rows}, latest


async def held_units(session: AsyncSession) -> dict[tuple[str, str], float]:
    """GPU units held per tenant and flavor, as device_allocations records them (devices of no flavor
    weigh nothing, as shares count them)."""
    rows = await session.execute(
        select(Claim.namespace, DeviceAllocation.flavor, func.sum(DeviceAllocation.units))
        .join(Claim, Claim.id == DeviceAllocation.claim_id)
        .where(DeviceAllocation.flavor.is_not(None))
        .group_by(Claim.namespace, DeviceAllocation.flavor)
        .order_by(Claim.namespace, DeviceAllocation.flavor))
    return {(tenant, str(flavor)): float(units or 0.0) for tenant, flavor, units in rows if units}


async def read_kept(session: AsyncSession, half_life: float) -> Kept:
    """What a starting keeper goes on from: the rows, with the units held now counted as held since they
    were written (the claims held their devices while no allocator ran)."""
    past, as_of = await read_rows(session, half_life)
    return Kept(past, as_of, await held_units(session))


async def past_use_now(session: AsyncSession, now: float, half_life: float) -> dict[tuple[str, str], float]:
    """The ledger's past use brought up to `now` with what is held: for the usage views and whatif."""
    if half_life <= 0:
        return {}
    kept = await read_kept(session, half_life)
    return bring_up_to(kept.past, kept.as_of, kept.held, now, half_life)


async def write_rows(session: AsyncSession, past: PastUse, as_of: float) -> None:
    """Make the rows equal `past` at `as_of`: an upsert of each figure, then the rows not written go (their
    tenants' past use decayed to nothing). At most one row per tenant and flavor."""
    values = [{"tenant": tenant, "flavor": flavor, "units": float(units), "as_of": float(as_of)}
              for (tenant, flavor), units in past.items() if units > NEGLIGIBLE]
    if values:
        dialect = session.get_bind().dialect.name
        upsert = postgresql_insert(PastUseRow) if dialect == "postgresql" else sqlite_insert(PastUseRow)
        await session.execute(upsert.on_conflict_do_update(
            index_elements=[PastUseRow.tenant, PastUseRow.flavor],
            set_={"units": upsert.excluded.units, "as_of": upsert.excluded.as_of}), values)
    await session.execute(delete(PastUseRow).where(PastUseRow.as_of < float(as_of)))


class PastUseKeeper:
    """The allocator's past use: read once, stepped at each decision transaction, written every
    `write_every` seconds in it. What a transaction did is `pending` until it commits (a rollback leaves
    the keeper as it was). With no half-life it keeps nothing and reads nothing."""

    def __init__(self, write_every: float = WRITE_EVERY) -> None:
        self.write_every = write_every
        self.kept: Kept | None = None  # None: not read from the ledger yet
        self.written_at: float | None = None  # the as_of of the last write committed
        self.wrote_any = False  # the last write committed left rows (an empty past use then needs one more)
        self._pending: Kept | None = None
        self._pending_write: tuple[float, bool] | None = None

    async def step(self, session: AsyncSession, now: float, half_life: float) -> PastUse:
        """Past use at `now`, with what was held since the last step (read from the ledger the first time):
        what the cycle's Snapshot carries."""
        if half_life <= 0:
            self.kept = self._pending = None  # turned on again later: read again from the ledger
            return {}
        kept = self._pending or self.kept
        if kept is None:
            kept = await read_kept(session, half_life)
        past = bring_up_to(kept.past, kept.as_of, kept.held, now, half_life)
        # a clock that went back does not move as_of back: the overlap would be counted again at the next step
        self._pending = Kept(past, now if kept.as_of is None else max(now, kept.as_of), kept.held)
        return past

    def holds(self, units: Mapping[tuple[str, str], float]) -> None:
        """The units held once this transaction's cycle is applied: what the next step counts as held."""
        if self._pending is not None:
            self._pending = Kept(self._pending.past, self._pending.as_of, dict(units))

    @property
    def stepped(self) -> bool:
        """This transaction stepped past use (a half-life is set)."""
        return self._pending is not None

    async def write(self, session: AsyncSession) -> None:
        """The rows written in the caller's transaction, when `write_every` passed since the last write and
        there is something to write (past use, or rows left to delete)."""
        pending = self._pending
        if pending is None or pending.as_of is None:
            return
        if self.written_at is not None and pending.as_of - self.written_at < self.write_every:
            return
        if not pending.past and not self.wrote_any and self.written_at is not None:
            return
        await write_rows(session, pending.past, pending.as_of)
        self._pending_write = (pending.as_of, bool(pending.past))

    def committed(self) -> None:
        if self._pending is not None:
            self.kept = self._pending
        if self._pending_write is not None:
            self.written_at, self.wrote_any = self._pending_write
        self._pending = self._pending_write = None

    def rolled_back(self) -> None:
        self._pending = self._pending_write = None
