"""What the cluster write-back reads from the ledger, on SQLite and PostgreSQL: a claim's state, allocation,
reason, the cluster uid of its document and who preempted it; and the writer's lease, which exactly one of
two allocators holds until it expires."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from shared.ledger.cluster_claims import hold_writer_lease, ledger_claims, release_writer_lease, tenant_names
from shared.ledger.engine import create_engine, sessions
from shared.ledger.schema import Claim, ClaimEvent, Tenant
from tests.builders import a_claim

ALLOCATION = {"nodeName": "node-03", "devices": {"results": [
    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-03", "device": "gpu-1"}]}}


def _spec(name: str, uid: str | None) -> dict[str, Any]:
    spec = json.loads(a_claim(name, "vision").request().build().model_dump_json(by_alias=True, exclude_none=True))
    if uid is not None:
        spec["metadata"]["uid"] = uid
    return spec


async def test_ledger_claims_carry_what_the_write_back_plans_on(ledger_url: str) -> None:
    engine = create_engine(ledger_url)
    try:
        async with sessions(engine)() as session, session.begin():
            session.add(Tenant(name="vision"))
            session.add_all([
                Claim(namespace="vision", name="training-gpu", state="Allocated", spec=_spec("training-gpu", "u-1"),
                      allocation=ALLOCATION, sequence=2),
                Claim(namespace="vision", name="from-queue", state="Pending", spec=_spec("from-queue", None),
                      reason="no room", sequence=1),
                Claim(namespace="vision", name="low-1", state="Preempted", spec=_spec("low-1", "u-3"),
                      reason="fair share", sequence=3)])
        async with sessions(engine)() as session, session.begin():
            low = await session.scalar(select(Claim.id).where(Claim.name == "low-1"))
            assert low is not None
            session.add_all([ClaimEvent(claim_id=low, sequence=2, state="Allocated"),
                             ClaimEvent(claim_id=low, sequence=3, state="Preempted", reason="fair share",
                                        by="vision/urgent-1")])
        async with sessions(engine)() as session:
            found = await ledger_claims(session, {("vision", "training-gpu"), ("vision", "from-queue"),
                                                  ("vision", "low-1"), ("vision", "absent")})
            assert await tenant_names(session) == ["vision"]
        assert set(found) == {("vision", "training-gpu"), ("vision", "from-queue"), ("vision", "low-1")}
        allocated = found[("vision", "training-gpu")]
        assert (allocated.state, allocated.uid, allocated.allocation) == ("Allocated", "u-1", ALLOCATION)
        assert found[("vision", "from-queue")].uid is None  # a claim of the queue carries no cluster uid
        assert (found[("vision", "low-1")].by, found[("vision", "low-1")].reason) == ("vision/urgent-1", "fair share")
    finally:
        await engine.dispose()


async def test_one_allocator_holds_the_writers_lease_until_it_expires(ledger_url: str) -> None:
    engine = create_engine(ledger_url)
    try:
        async def ask(holder: str, now: float) -> bool:
            async with sessions(engine)() as session, session.begin():
                return await hold_writer_lease(session, holder, now, ttl=15.0)

        assert await ask("a", 1000.0)
        assert not await ask("b", 1001.0)  # a holds it
        assert await ask("a", 1010.0)  # renewed to 1025
        assert not await ask("b", 1024.0)
        assert await ask("b", 1026.0)  # a stopped renewing: b takes it
        assert not await ask("a", 1027.0)
        async with sessions(engine)() as session, session.begin():
            await release_writer_lease(session, "a", 1028.0)  # not a's: nothing changes
        assert not await ask("a", 1029.0)
        async with sessions(engine)() as session, session.begin():
            await release_writer_lease(session, "b", 1030.0)  # b stops cleanly: a takes it at once
        assert await ask("a", 1030.5)
    finally:
        await engine.dispose()
