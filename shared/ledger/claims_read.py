"""Every claim that waits or runs, read whole, as a decision cycle's input: for what-if, which runs
rarely (the allocator reads only what changed: shared/ledger/queue.load_queue)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.admission.model import ClaimKey, Running, Waiting
from shared.dra import model as dra
from shared.dra.results import Allocation, State
from shared.ledger.schema import Claim


async def read_claims(session: AsyncSession
                      ) -> tuple[list[Running], list[Waiting], dict[ClaimKey, dra.ResourceClaim]]:
    """Who runs and who waits, in the order they arrived, and every such claim's document."""
    return claims_of(await claim_rows(session))


async def claim_rows(session: AsyncSession) -> list[Any]:
    """The rows `claims_of` reads, fetched whole: a caller may end its transaction (on SQLite, the
    ledger's write lock) before the documents are parsed."""
    return list(await session.execute(
        select(Claim.id, Claim.namespace, Claim.name, Claim.state, Claim.spec, Claim.priority, Claim.preemptible,
               Claim.arrival, Claim.allocation, Claim.allocated_at)
        .where(Claim.state.in_((State.PENDING.value, State.ALLOCATED.value))).order_by(Claim.id)))


def claims_of(rows: Iterable[Any]) -> tuple[list[Running], list[Waiting], dict[ClaimKey, dra.ResourceClaim]]:
    running: list[Running] = []
    waiting: list[Waiting] = []
    documents: dict[ClaimKey, dra.ResourceClaim] = {}
    for row_id, namespace, name, state, spec, priority, preemptible, arrival, allocation, allocated_at in rows:
        try:
            claim = documents[(namespace, name)] = dra.ResourceClaim.model_validate(spec)
        except ValidationError:
            continue  # a row no decision could read (the allocator stores only claims it parsed)
        if state == State.ALLOCATED.value and allocation:
            since = allocated_at.timestamp() if allocated_at else None
            running.append(Running(namespace, name, Allocation.from_json(allocation), priority, preemptible,
                                   arrival or row_id, int(since * 1e6) if since is not None else row_id, since))
        elif state == State.PENDING.value:
            waiting.append(Waiting(namespace, name, claim, priority, preemptible, arrival or row_id, answered=True))
    return running, waiting, documents
