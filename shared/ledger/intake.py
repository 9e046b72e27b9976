"""What a batch of claim messages reads of the ledger and writes to it, inside the decision transaction.

The batch is applied in three steps, each visited once: `read` takes in one go what its messages name (the
claim rows, the remembered releases of unknown claims, the waiting counts of tenants with a maxPending);
the allocator applies the messages to those rows in memory (services/allocator/claim_batch.py), recording what
is to be written in an `IntakeWrites`; `write` writes it. A query and a flush per message cost most of a
batch, nearly all of it the flush of each insert.

A release of a name the ledger has no row of leaves no claim row: it is remembered in early_releases for
the inbox's retention, at most a bounded number per tenant, the oldest forgotten first."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import defer

from shared.dra.results import State
from shared.ledger.decisions import release_devices
from shared.ledger.schema import OUTSIDE, Claim, EarlyRelease
from shared.ledger.unit_of_work import UnitOfWork, in_chunks, one_of

_CLAIMS = cast(Table, Claim.__table__)
# Columns of claim rows a message's lookup does not load: parsing their JSON cost most of it. Reading one
# by mistake raises instead of querying. A message clears the allocation and the explanation.
_UNREAD_BY_MESSAGES = tuple(defer(column, raiseload=True) for column in (Claim.spec, Claim.explain, Claim.allocation))


@dataclass
class IntakeView:
    """What a batch's messages name, as the ledger holds it: the row of each claim that has one (its JSON
    columns unread), the remembered releases of the others, and the waiting claims of each tenant asked."""

    rows: dict[tuple[str, str], Claim]
    early: dict[tuple[str, str], int]
    waiting: dict[str, int]


@dataclass(frozen=True)
class Inserted:
    """Rows written now, in this order (their ids follow it): claims that later messages of the batch
    name, a claim Rejected or Released under a new name."""

    rows: tuple[Claim, ...]


@dataclass(frozen=True)
class Deleted:
    """A row deleted now, before a new claim takes its name."""

    row: Claim


@dataclass
class IntakeWrites:
    """What a batch writes, besides the changes to the rows in hand and its statuses (in the unit's
    `writes`): rows inserted and deleted in the order the messages asked for it, then the claims queued
    since (one statement, in the order they were queued: their ids are their arrival), the devices of
    released claims, and the releases of unknown claims remembered (a sequence) or forgotten (None)."""

    steps: list[Inserted | Deleted] = field(default_factory=list)
    queued: list[dict[str, Any]] = field(default_factory=list)  # their columns
    released: list[Claim] = field(default_factory=list)
    early: dict[tuple[str, str], int | None] = field(default_factory=dict)


async def read(work: UnitOfWork, named: Iterable[tuple[str, str]], limited: Iterable[str]) -> IntakeView:
    """The rows of the claims named (tenant, name), the remembered releases of those without one, and the
    waiting claims of the `limited` tenants (none asked when there are none)."""
    named = set(named)
    rows = await _claims_named(work.session, named)
    early = await _early_releases_named(work.session, named - rows.keys())
    tenants = sorted(set(limited))
    return IntakeView(rows, early, await _pending_counts(work.session, tenants) if tenants else {})


async def write(work: UnitOfWork, writes: IntakeWrites, now: datetime, early_releases_per_tenant: int) -> None:
    """Write what the batch did. Rows deleted take their history with them; their statuses are still sent
    (`Writes.deleted`)."""
    session = work.session
    for step in writes.steps:
        if isinstance(step, Inserted):
            session.add_all(step.rows)
        else:
            await session.delete(step.row)
        await session.flush()
        if isinstance(step, Deleted):
            work.writes.deleted(step.row)
    if writes.queued:  # their `arrival` stays empty, which means their id: the order they were queued in
        revision = work.revision if work.revision is not None else OUTSIDE
        await session.execute(insert(_CLAIMS), [{**values, "revision": revision} for values in writes.queued])
    await release_devices(work, [row.id for row in writes.released])
    if writes.early:
        await _write_early_releases(session, writes.early, now, early_releases_per_tenant)


async def _pending_counts(session: AsyncSession, tenants: Sequence[str]) -> dict[str, int]:
    """Waiting claims per tenant (every tenant asked has an entry)."""
    counts = dict.fromkeys(tenants, 0)
    counts.update({namespace: int(n) for namespace, n in await session.execute(
        select(Claim.namespace, func.count()).where(Claim.state == State.PENDING.value, Claim.namespace.in_(tenants))
        .group_by(Claim.namespace))})
    return counts


async def _claims_named(session: AsyncSession, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], Claim]:
    """The rows of these claims (namespace, name) that exist, read in bulk. Asked as namespaces and names
    (a few rows more, dropped here), which the (namespace, name) index answers: SQLite scans the whole
    table for a tuple IN."""
    rows: dict[tuple[str, str], Claim] = {}
    namespaces = sorted({namespace for namespace, _ in wanted})
    for chunk in in_chunks(sorted({name for _, name in wanted})):
        for row in await session.scalars(select(Claim).options(*_UNREAD_BY_MESSAGES).where(
                one_of(session, Claim.namespace, namespaces), one_of(session, Claim.name, chunk))):
            if (key := (row.namespace, row.name)) in wanted:
                rows[key] = row
    return rows


async def specs_of(work: UnitOfWork, ids: Iterable[int]) -> dict[int, Any]:
    """The stored documents of these claim rows, by row id: read only for claims submitted again while
    they wait or run (to tell a re-send from another spec under the same name)."""
    found: dict[int, Any] = {}
    for chunk in in_chunks(sorted(set(ids))):
        found.update({int(i): spec for i, spec in await work.session.execute(
            select(Claim.id, Claim.spec).where(Claim.id.in_(chunk)))})
    return found


async def _early_releases_named(session: AsyncSession,
                                wanted: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The remembered releases of these claims (namespace, name): the stream sequence of each. Asked as
    tenants and names, as `_claims_named` does; nothing is asked for a batch that names no unknown claim."""
    found: dict[tuple[str, str], int] = {}
    tenants = sorted({tenant for tenant, _ in wanted})
    for chunk in in_chunks(sorted({name for _, name in wanted})):
        for tenant, name, released in await session.execute(
                select(EarlyRelease.tenant, EarlyRelease.name, EarlyRelease.released_seq).where(
                    one_of(session, EarlyRelease.tenant, tenants), one_of(session, EarlyRelease.name, chunk))):
            if (tenant, name) in wanted:
                found[(tenant, name)] = int(released)
    return found


async def _write_early_releases(session: AsyncSession, changed: Mapping[tuple[str, str], int | None],
                                now: datetime, per_tenant: int) -> None:
    """Remember (a sequence) or forget (None) releases of unknown claims; then a tenant that remembers more
    than `per_tenant` forgets its oldest, so a flood of releases of names never submitted stays bounded."""
    by_tenant: dict[str, list[str]] = collections.defaultdict(list)
    for tenant, name in changed:
        by_tenant[tenant].append(name)
    for tenant, names in by_tenant.items():
        for chunk in in_chunks(sorted(names)):
            await session.execute(delete(EarlyRelease).where(EarlyRelease.tenant == tenant,
                                                             EarlyRelease.name.in_(chunk)))
    remembered = {key: released for key, released in changed.items() if released is not None}
    if not remembered:
        return
    await session.execute(insert(EarlyRelease), [
        {"tenant": tenant, "name": name, "released_seq": released, "released_at": now}
        for (tenant, name), released in remembered.items()])
    for tenant in sorted({tenant for tenant, _ in remembered}):
        count = int(await session.scalar(select(func.count()).select_from(EarlyRelease)
                                         .where(EarlyRelease.tenant == tenant)) or 0)
        if count > per_tenant:
            oldest = (select(EarlyRelease.name).where(EarlyRelease.tenant == tenant)
                      .order_by(EarlyRelease.released_at, EarlyRelease.released_seq).limit(count - per_tenant))
            await session.execute(delete(EarlyRelease).where(EarlyRelease.tenant == tenant,
                                                             EarlyRelease.name.in_(oldest)))


async def prune_early_releases(session: AsyncSession, before: datetime, limit: int) -> int:
    """Forget up to about `limit` releases of unknown claims remembered before `before`; how many went (a
    pass of services/runtime/ledger_pruning.Pruner)."""
    oldest = select(EarlyRelease.released_at).where(EarlyRelease.released_at < before).order_by(
        EarlyRelease.released_at).limit(limit)
    cutoff = await session.scalar(select(func.max(oldest.subquery().c.released_at)))
    if cutoff is None:
        return 0
    result = await session.execute(delete(EarlyRelease).where(EarlyRelease.released_at <= cutoff,
                                                              EarlyRelease.released_at < before))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
