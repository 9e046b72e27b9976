"""The allocator's reads and writes in the ledger. Nothing here commits: the caller's transaction does."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared import dra, events, subjects
from shared.allocation import Decision, DeviceKey, State
from shared.claims import settings_of
from shared.ledger.schema import Claim, DeviceAllocation, InboxMessage, OutboxEvent


async def already_processed(session: AsyncSession, consumer: str, message_id: str) -> bool:
    found = await session.get(InboxMessage, (consumer, message_id))
    return found is not None


def record_processed(session: AsyncSession, consumer: str, message_id: str) -> None:
    session.add(InboxMessage(consumer=consumer, message_id=message_id))


async def devices_in_use(session: AsyncSession) -> frozenset[DeviceKey]:
    rows = await session.execute(select(DeviceAllocation.driver, DeviceAllocation.pool, DeviceAllocation.device))
    return frozenset((r[0], r[1], r[2]) for r in rows)


async def pending_claims(session: AsyncSession) -> list[Claim]:
    rows = await session.scalars(select(Claim).where(Claim.state == State.PENDING.value).order_by(Claim.id))
    return list(rows)


async def find_claim(session: AsyncSession, namespace: str, name: str) -> Claim | None:
    return await session.scalar(select(Claim).where(Claim.namespace == namespace, Claim.name == name))


def claim_document(row: Claim) -> dra.ResourceClaim:
    return dra.ResourceClaim.model_validate(row.spec)


def emit_status(session: AsyncSession, row: Claim) -> None:
    """Bump the claim's sequence and queue its status event in the same transaction."""
    row.sequence = (row.sequence or 0) + 1
    row.updated_at = datetime.now(UTC)
    payload = events.claim_status(
        namespace=row.namespace, name=row.name, state=row.state, allocation=row.allocation,
        reason=row.reason, sequence=row.sequence,
    )
    session.add(
        OutboxEvent(
            subject=subjects.status(row.namespace, row.name),
            message_id=f"status:{row.id}:{row.sequence}",
            payload=payload,
        )
    )


def emit_event(session: AsyncSession, subject: str, message_id: str, payload: dict[str, Any]) -> None:
    session.add(OutboxEvent(subject=subject, message_id=message_id, payload=payload))


async def new_claim(session: AsyncSession, claim: dra.ResourceClaim) -> Claim:
    settings = settings_of(claim)
    row = Claim(
        namespace=claim.metadata.namespace or "default",
        name=claim.metadata.name,
        state=State.PENDING.value,
        spec=json.loads(claim.model_dump_json(by_alias=True, exclude_none=True)),
        priority=settings.priority,
        preemptible=settings.preemptible,
        sequence=0,
    )
    session.add(row)
    await session.flush()
    return row


async def apply_decision(session: AsyncSession, row: Claim, decision: Decision) -> bool:
    """Write the decision; returns whether the claim's visible state changed (and an event is due)."""
    allocation = decision.allocation.to_json() if decision.allocation else None
    changed = (row.state, row.reason, row.allocation) != (decision.state.value, decision.reason, allocation)
    row.state = decision.state.value
    row.reason = decision.reason
    row.allocation = allocation
    row.node = decision.allocation.node if decision.allocation else None
    if decision.allocation is not None:
        for result in decision.allocation.results:
            if result.admin_access:
                continue  # monitoring access holds no device
            session.add(
                DeviceAllocation(
                    driver=result.driver, pool=result.pool, device=result.device, claim_id=row.id,
                    node=decision.allocation.node, request=result.request,
                )
            )
    return changed


async def release_devices(session: AsyncSession, row: Claim) -> None:
    await session.execute(delete(DeviceAllocation).where(DeviceAllocation.claim_id == row.id))


async def unpublished(session: AsyncSession, limit: int = 500) -> Sequence[OutboxEvent]:
    rows = await session.scalars(
        select(OutboxEvent).where(OutboxEvent.published_at.is_(None)).order_by(OutboxEvent.id).limit(limit)
    )
    return list(rows)


async def mark_published(session: AsyncSession, ids: Sequence[int]) -> None:
    await session.execute(
        update(OutboxEvent).where(OutboxEvent.id.in_(ids)).values(published_at=datetime.now(UTC))
    )
