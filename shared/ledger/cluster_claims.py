"""What the cluster write-back reads from the ledger: the ledger's claims of given names (their state,
allocation, reason, the cluster uid their document carries and who preempted them), the tenants, and the
writer's lease, so that of several allocators following one cluster exactly one writes to it."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import UTC, datetime

from sqlalchemy import func, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.kube_claims.writeback import LedgerClaim
from shared.ledger.schema import AllocatorLease, Claim, ClaimEvent, Tenant

WRITER_LEASE = "kube-writer"  # an allocator_leases row of its own: not a decision shard, never locked by one
_CHUNK = 500


async def ledger_claims(session: AsyncSession, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], LedgerClaim]:
    """The ledger's claims named by (tenant, name); absent names are left out."""
    found: dict[tuple[str, str], LedgerClaim] = {}
    ordered = sorted(keys)
    for start in range(0, len(ordered), _CHUNK):
        chunk = ordered[start:start + _CHUNK]
        rows = (await session.execute(
            select(Claim.id, Claim.namespace, Claim.name, Claim.state, Claim.allocation, Claim.reason, Claim.spec)
            .where(tuple_(Claim.namespace, Claim.name).in_(chunk)))).all()
        by = await _preemptors(session, [row.id for row in rows if row.state != "Allocated"])
        for row in rows:
            spec = row.spec if isinstance(row.spec, dict) else {}
            uid = (spec.get("metadata") or {}).get("uid")
            found[(row.namespace, row.name)] = LedgerClaim(row.namespace, row.state, row.allocation, row.reason,
                                                           str(uid) if uid else None, by.get(row.id))
    return found


async def _preemptors(session: AsyncSession, claim_ids: Iterable[int]) -> dict[int, str]:
    """Who preempted each claim whose last allocation ended in preemption (its last Allocated or Preempted
    event is a Preempted one)."""
    ids = list(claim_ids)
    if not ids:
        return {}
    last = (select(ClaimEvent.claim_id, func.max(ClaimEvent.sequence).label("sequence"))
            .where(ClaimEvent.claim_id.in_(ids), ClaimEvent.state.in_(("Allocated", "Preempted")))
            .group_by(ClaimEvent.claim_id).subquery())
    rows = await session.execute(select(ClaimEvent.claim_id, ClaimEvent.state, ClaimEvent.by).join(
        last, (ClaimEvent.claim_id == last.c.claim_id) & (ClaimEvent.sequence == last.c.sequence)))
    return {claim_id: by for claim_id, state, by in rows if state == "Preempted" and by}


async def tenant_names(session: AsyncSession) -> list[str]:
    return list(await session.scalars(select(Tenant.name)))


async def hold_writer_lease(session: AsyncSession, holder: str, now: float, ttl: float) -> bool:
    """Take or renew the cluster writer's lease; True while `holder` has it. The row is locked for the
    check, so two allocators asking at once see one another."""
    row = await session.scalar(select(AllocatorLease).where(AllocatorLease.shard == WRITER_LEASE).with_for_update())
    if row is None:
        session.add(AllocatorLease(shard=WRITER_LEASE, holder=holder,
                                   expires_at=datetime.fromtimestamp(now + ttl, UTC), revision=0))
        await session.flush()
        return True
    expires = row.expires_at
    if expires is not None and expires.tzinfo is None:  # SQLite keeps naive datetimes
        expires = expires.replace(tzinfo=UTC)
    if row.holder != holder and expires is not None and expires.timestamp() > now:
        return False
    row.holder = holder
    row.expires_at = datetime.fromtimestamp(now + ttl, UTC)
    return True


async def release_writer_lease(session: AsyncSession, holder: str, now: float) -> None:
    """Let the lease go at a clean stop, so the next allocator (or this one restarted) writes at once instead of
    waiting for it to expire."""
    await session.execute(update(AllocatorLease).where(AllocatorLease.shard == WRITER_LEASE,
                                                       AllocatorLease.holder == holder)
                          .values(expires_at=datetime.fromtimestamp(now, UTC)))
