"""Releases of claims the ledger has no row of, against real databases: remembered apart from the claims
(bounded per tenant, the oldest forgotten first), handed on to the row a later submission writes (a claim
queued, or one Rejected for its tenant's maxPending), and answered once each, within a batch too."""

from __future__ import annotations

from sqlalchemy import select

from services.allocator.service import Allocator
from shared.admission.quota import parse_quotas
from shared.dra.classes import BUILTIN_CLASSES
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.quota_store import apply_quota_config
from shared.ledger.schema import Claim, EarlyRelease, OutboxEvent
from tests.integration.test_allocator_batch import _release, _submit


async def test_a_remembered_release_goes_to_the_row_of_the_next_submission(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    allocator = Allocator(engine, BUILTIN_CLASSES, early_releases_per_tenant=2)
    try:
        async with sessions(engine)() as session, session.begin():
            await apply_quota_config(session, parse_quotas({"kind": "Quotas", "tenants": [
                {"name": "t", "maxPending": 0}]}), "test")
        # three unknown names, one twice in the batch: two remembered (the newest), four answers
        await allocator.transaction.decide([_release("x", "r1", 10), _release("y", "r2", 11), _release("x", "r3", 12),
                                          _release("z", "r4", 13)])
        async with sessions(engine)() as session:
            remembered = {(r.name, r.released_seq) for r in await session.scalars(select(EarlyRelease))}
            answers = [r.payload for r in await session.scalars(
                select(OutboxEvent).where(OutboxEvent.ttl_s.is_not(None)).order_by(OutboxEvent.id))]
        assert remembered == {("x", 12), ("z", 13)}
        assert [(a["name"], a["state"], a["sequence"]) for a in answers] == [
            ("x", "Released", 0), ("y", "Released", 0), ("x", "Released", 0), ("z", "Released", 0)]

        # published after the releases: x is refused (maxPending 0) and its Rejected row carries the release;
        # z, published before its release (redelivered), ends Released
        await allocator.transaction.decide([_submit("x", "s1", 20), _submit("z", "s0", 5)])
        async with sessions(engine)() as session:
            rows = {r.name: (r.state, r.released_seq, r.sequence) for r in await session.scalars(select(Claim))}
            left = list(await session.scalars(select(EarlyRelease.name)))
        assert rows == {"x": ("Rejected", 12, 1), "z": ("Released", 13, 1)}
        assert left == []
    finally:
        await engine.dispose()
