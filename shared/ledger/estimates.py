"""Start estimates in the ledger (issue 39): the runtimes claims were observed to run (what the estimates run
claims for where no claimbroker.io/expected-runtime says), the estimates published on waiting claims'
status subjects (each a status of its own, written in a small transaction beside the decisions), and their
error against the actual starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from shared.admission.estimate_publishing import move
from shared.admission.model import ClaimKey
from shared.contract import events, subjects
from shared.dra.results import State
from shared.ledger.schema import AllocatorLease, Claim, ClaimEvent, OutboxEvent
from shared.ledger.unit_of_work import UnitOfWork, in_chunks

_CLAIMS, _HISTORY, _OUTBOX = (cast(Table, model.__table__) for model in (Claim, ClaimEvent, OutboxEvent))
MAX_RUNS = 20_000  # runs read at most per observation: the latest ones


def unix(moment: datetime) -> float:
    """Seconds since the epoch; SQLite gives back its timestamps without their zone, which is UTC."""
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


async def observed_runtimes(work: UnitOfWork, since: float, limit: int = MAX_RUNS
                            ) -> list[tuple[str, str | None, float]]:
    """The runs that ended Released since `since` (unix seconds; at most `limit`, the latest allocated first):
    per run its tenant, the flavor it held and how long it ran, from its Allocated status to its Released
    status that came next (a claim preempted, withdrawn while waiting, or lost with its node is no run)."""
    allocated, released = aliased(ClaimEvent), aliased(ClaimEvent)
    rows = await work.session.execute(
        select(Claim.namespace, Claim.flavor, allocated.at, released.at)
        .join(released, and_(released.claim_id == Claim.id, released.state == State.RELEASED.value))
        .join(allocated, and_(allocated.claim_id == Claim.id, allocated.sequence == released.sequence - 1,
                              allocated.state == State.ALLOCATED.value))
        .where(Claim.state == State.RELEASED.value, Claim.allocated_at >= datetime.fromtimestamp(since, UTC))
        .order_by(Claim.allocated_at.desc()).limit(limit))
    return [(tenant, flavor, unix(ended) - unix(started)) for tenant, flavor, started, ended in rows]


async def published_estimates(work: UnitOfWork) -> dict[ClaimKey, float | None]:
    """Per waiting claim with an estimate published in its current wait, its p50 (unix seconds; None: a null
    one, with its reason): where a restarted estimator goes on from, so it publishes none of them again. A claim
    sent back to the queue keeps the p50 of its earlier wait (the estimates' error) but not its estimate nor its
    reason (cleared at its allocation; the estimate is JSON null, so looked at here)."""
    rows = await work.session.execute(
        select(Claim.namespace, Claim.name, Claim.estimate_p50, Claim.estimated_start, Claim.estimate_reason)
        .where(Claim.state == State.PENDING.value,
               or_(Claim.estimate_p50.is_not(None), Claim.estimate_reason.is_not(None))))
    published: dict[ClaimKey, float | None] = {}
    for tenant, name, p50, estimate, reason in rows:
        if estimate and p50 is not None:
            published[(tenant, name)] = float(p50)
        elif estimate is None and reason:
            published[(tenant, name)] = None
    return published


@dataclass(frozen=True)
class EstimateWrite:
    """A waiting claim's estimate to publish: the contract's estimatedStart object (None: nothing can be said,
    and `reason` why: its status's estimatedStartReason) and its p50 (unix seconds)."""

    tenant: str
    name: str
    estimated_start: dict[str, Any] | None
    p50: float | None
    reason: str | None = None


_SET_ESTIMATE = (update(_CLAIMS).where(_CLAIMS.c.id == bindparam("row_id"),
                                       _CLAIMS.c.sequence == bindparam("old_sequence"))
                 .values(sequence=bindparam("new_sequence"),
                         estimated_start=bindparam("new_estimate", type_=_CLAIMS.c.estimated_start.type),
                         estimate_p50=bindparam("new_p50", type_=_CLAIMS.c.estimate_p50.type),
                         first_estimate_p50=bindparam("new_first", type_=_CLAIMS.c.first_estimate_p50.type),
                         estimate_reason=bindparam("new_reason", type_=_CLAIMS.c.estimate_reason.type)))


@dataclass(frozen=True)
class Written:
    """What write_estimates did: the claims it wrote, and those whose row holds an estimate it was not due
    against (with that estimate's p50; None: the row holds a null one, with its reason)."""

    claims: list[ClaimKey]
    held: dict[ClaimKey, float | None]


async def write_estimates(work: UnitOfWork, shard: str, estimates: Sequence[EstimateWrite],
                          now: float | None = None) -> Written:
    """Each estimate as the claim's next status (its state, reason and unsatisfiable mark as its last decision
    gave them, the next sequence, the estimate), with its history row and its outbox event, for the claims still
    Pending and answered (a claim a decision took meanwhile, or sent back to the queue unanswered, is left to its
    decisions). The shard's
    turn is taken first (its lease row locked, as a decision transaction does, not renewed), so no decision
    reads a claim's sequence while this writes it (nothing is written before a decision transaction committed
    the lease row). The claim rows keep their revision: nothing the allocator's
    queue reads changes. With `now`, an estimate is written only where it is still due against what the row
    holds (shared/admission/estimate_publishing.move: a second allocator, or a restarted one, may have
    published it already)."""
    session = work.session
    if await session.scalar(select(AllocatorLease.shard).where(AllocatorLease.shard == shard)
                            .with_for_update()) is None:
        return Written([], {})  # no decision committed yet (the first creates the lease row): no estimate either
    wanted = {(e.tenant, e.name): e for e in estimates}
    rows: list[Any] = []
    held: dict[ClaimKey, float | None] = {}
    for chunk in in_chunks(sorted(wanted)):
        # by tenants and names, each a list, then the pairs kept: PostgreSQL searches the (namespace, name) index
        # with both lists, where a list of pairs was a scan of every claim row (120 ms for 500 of 10,000)
        found = await session.execute(
            select(Claim.id, Claim.namespace, Claim.name, Claim.reason, Claim.sequence, Claim.first_estimate_p50,
                   Claim.estimate_p50, Claim.estimated_start, Claim.explain, Claim.estimate_reason)
            .where(Claim.namespace.in_(sorted({t for t, _ in chunk})), Claim.name.in_([n for _, n in chunk]),
                   Claim.state == State.PENDING.value, Claim.reason.is_not(None)))
        for row in found:
            key = (row[1], row[2])
            if key not in wanted:
                continue
            published = bool(row[7]) or bool(row[9])  # an estimate, or a null one with its reason
            estimate = wanted[key]
            reason_changed = not row[7] and bool(row[9]) and estimate.p50 is None and (estimate.reason or "") != row[9]
            if now is not None and move(published, row[6] if row[7] else None, estimate.p50, now,
                                        reason_changed=reason_changed) is None:
                held[key] = row[6] if row[7] else None
            else:
                explained = row[8] if isinstance(row[8], dict) else {}
                rows.append((*row[:6], explained.get("unsatisfiable") is True))
    if not rows:
        return Written([], held)
    updates, history, outbox = [], [], []
    for row_id, tenant, name, reason, sequence, first, unsatisfiable in sorted(rows):
        estimate = wanted[(tenant, name)]
        following = (sequence or 0) + 1
        why = estimate.reason if estimate.estimated_start is None and estimate.reason else None
        updates.append({"row_id": row_id, "old_sequence": sequence, "new_sequence": following,
                        "new_estimate": estimate.estimated_start, "new_p50": estimate.p50,
                        "new_first": first if first is not None else estimate.p50, "new_reason": why})
        history.append({"claim_id": row_id, "sequence": following, "state": State.PENDING.value, "reason": reason,
                        "node": None, "by": None})
        payload = events.claim_status(namespace=tenant, name=name, state=State.PENDING.value, allocation=None,
                                      reason=reason, sequence=following, unsatisfiable=unsatisfiable)
        payload["estimatedStart"] = cast(Any, estimate.estimated_start)
        if why:
            payload["estimatedStartReason"] = why
        outbox.append({"subject": subjects.status(tenant, name), "message_id": f"status:{row_id}:{following}",
                       "payload": payload, "ttl_s": None})
    await session.execute(_SET_ESTIMATE, updates)
    await session.execute(insert(_HISTORY), history)
    await session.execute(insert(_OUTBOX), outbox)
    work.flushed.extend(outbox)  # committed with the transaction: its relay may publish them from memory
    return Written([(tenant, name) for _, tenant, name, *_ in rows], held)


@dataclass(frozen=True)
class EstimateError:
    """A claim allocated with an estimate published: its tenant, flavor, and how much later than the first
    and the last p50 published it started (seconds; negative: earlier)."""

    tenant: str
    flavor: str | None
    first: float | None
    last: float


async def estimate_errors(session: AsyncSession, since: float, tenant: str | None = None,
                          limit: int = MAX_RUNS) -> list[EstimateError]:
    """The claims allocated since `since` (unix seconds; at most `limit`, the latest first; of `tenant` only
    when given) that had an estimate published while they waited."""
    where = [Claim.allocated_at >= datetime.fromtimestamp(since, UTC), Claim.estimate_p50.is_not(None)]
    if tenant is not None:
        where.append(Claim.namespace == tenant)
    rows = await session.execute(
        select(Claim.namespace, Claim.flavor, Claim.allocated_at, Claim.first_estimate_p50, Claim.estimate_p50)
        .where(*where).order_by(Claim.allocated_at.desc()).limit(limit))
    out = []
    for tenant, flavor, allocated_at, first, last in rows:
        if allocated_at is None or last is None:  # what the query leaves out
            continue
        started = unix(allocated_at)
        out.append(EstimateError(tenant, flavor, started - first if first is not None else None, started - last))
    return out
