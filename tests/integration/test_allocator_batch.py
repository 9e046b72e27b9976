"""One batch of claim messages in one decision transaction, against real databases: the inbox is read once
per batch and claim lookups do not flush what earlier messages wrote, yet every message sees what the
earlier ones did (a claim submitted, released and submitted again in one batch; a duplicate id; a message
the inbox already holds). A claim submitted again carries on its status sequence: on SQLite the new row may
take the old row's id, and status ids ("status:<row>:<sequence>") must stay unique."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import func, select

from services.allocator.service import Allocator
from shared.admission.quota import parse_quotas
from shared.contract import subjects
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.results import Allocation, Decision, DeviceResult, State
from shared.ledger.decisions import claim_rows
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.queue import load_queue
from shared.ledger.quota_store import apply_quota_config
from shared.ledger.schema import Claim, ClaimEvent, DeviceAllocation, InboxMessage, OutboxEvent
from shared.ledger.unit_of_work import ClaimRow, UnitOfWork, unit_of_work
from tests.builders import a_claim


def _message(subject: str, body: dict[str, Any], message_id: str, sequence: int) -> Any:
    """What the allocator reads of a JetStream message."""
    return SimpleNamespace(subject=subject, data=json.dumps(body).encode(), headers={"Nats-Msg-Id": message_id},
                           metadata=SimpleNamespace(sequence=SimpleNamespace(stream=sequence)))


def _submit(name: str, message_id: str, sequence: int) -> Any:
    return _message(subjects.submit("t"), a_claim(name, "t").request().document(), message_id, sequence)


def _release(name: str, message_id: str, sequence: int) -> Any:
    return _message(subjects.release("t"), {"name": name}, message_id, sequence)


async def test_a_batch_sees_what_its_earlier_messages_did(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    allocator = Allocator(engine, BUILTIN_CLASSES)
    try:
        await allocator.transaction.decide([_submit("old", "m0", 1)])
        await allocator.transaction.decide([
            _submit("a", "m1", 2), _release("a", "m2", 3), _submit("a", "m3", 4),  # resubmitted once released
            _submit("b", "m4", 5), _submit("b", "m4", 6),  # the same id twice in one batch
            _release("old", "m5", 7), _submit("old", "m0", 1),  # m0 again: the inbox holds it (a redelivery)
        ])
        async with sessions(engine)() as session:
            rows = {r.name: r for r in await session.scalars(select(Claim))}
            inbox = set(await session.scalars(select(InboxMessage.message_id)))
            history = [tuple(e) for e in await session.execute(
                select(Claim.name, ClaimEvent.state).join(Claim, Claim.id == ClaimEvent.claim_id)
                .order_by(ClaimEvent.id))]
            events = await session.scalar(select(func.count()).select_from(ClaimEvent))
        assert {n: r.state for n, r in rows.items()} == {"a": "Pending", "b": "Pending", "old": "Released"}
        assert inbox == {"m0", "m1", "m2", "m3", "m4", "m5"}
        assert ("old", "Released") in history and events == len(history)
        queued = {n: r.arrival or r.id for n, r in rows.items()}  # no arrival: its id (see Claim.arrival)
        assert queued["a"] > queued["old"]  # the second "a"
        assert rows["a"].sequence == 2  # its statuses carry on from the first "a" (Released: 1)
        assert queued["b"] > queued["a"]
    finally:
        await engine.dispose()


async def _a_queued_claim(work: UnitOfWork) -> ClaimRow:
    work.session.add(Claim(namespace="t", name="c", state="Pending", spec=a_claim("c", "t").request().document(),
                           sequence=0, priority=0, preemptible=True))
    await work.session.flush()
    queue = await load_queue(work)
    return (await claim_rows(work, queue, [("t", "c")]))[("t", "c")]


async def _emit(work: UnitOfWork) -> None:
    work.writes.status(await _a_queued_claim(work))


async def _decide(work: UnitOfWork) -> None:
    work.writes.decision(await _a_queued_claim(work), Decision(State.PENDING, reason="waits"))


@pytest.mark.parametrize("recorded", [_emit, _decide], ids=["status", "decision"])
async def test_what_a_unit_of_work_records_is_written_when_it_commits(ledger_url: str, recorded: Any) -> None:
    """Statuses and decided claim rows are written in bulk as the unit of work commits, so no decision or
    status can be lost silently; when its block raises, none of it is written."""
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    try:
        with pytest.raises(RuntimeError, match="refused"):
            async with unit_of_work(sessions(engine)) as work:
                await recorded(work)
                raise RuntimeError("refused")
        async with sessions(engine)() as session:
            assert await session.scalar(select(func.count()).select_from(Claim)) == 0
        async with unit_of_work(sessions(engine)) as work:
            await recorded(work)
        async with sessions(engine)() as session:
            written = await session.scalar(select(Claim))
            history = list(await session.scalars(select(ClaimEvent.state)))
        assert written is not None
        assert (written.state, written.reason, history) == (
            ("Pending", None, ["Pending"]) if recorded is _emit else ("Pending", "waits", []))
    finally:
        await engine.dispose()


async def test_a_decision_is_written_with_its_devices_and_revision(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    allocation = Allocation("n1", (DeviceResult("gpu", "gpu.nvidia.com", "n1", "gpu-0"),))
    try:
        async with unit_of_work(sessions(engine)) as work:
            revision = await work.take_turn("default", "test", 0.0)
            row = await _a_queued_claim(work)
            row.explain = {"why": "kept"}
            assert work.writes.decision(row, Decision(State.ALLOCATED, allocation),
                                        {("gpu.nvidia.com", "n1", "gpu-0"): ("H100", 2.0)})
            work.writes.status(row)
        async with sessions(engine)() as session:
            written = await session.scalar(select(Claim))
            devices = [(d.device, d.node, d.flavor, d.units) for d in await session.scalars(select(DeviceAllocation))]
            statuses = [(e.sequence, e.state) for e in await session.scalars(select(ClaimEvent))]
        assert written is not None
        assert (written.state, written.node, written.allocation, written.explain, written.sequence,
                written.revision, written.flavor) == ("Allocated", "n1", allocation.to_json(), {"why": "kept"}, 1,
                                                      revision, "H100")
        assert devices == [("gpu-0", "n1", "H100", 2.0)] and statuses == [(1, "Allocated")]
    finally:
        await engine.dispose()


async def test_a_tenant_past_its_max_pending_gets_its_new_claims_rejected_with_the_number(ledger_url: str) -> None:
    """Flood control: with nothing to place them on, t may hold two waiting claims; a release makes room."""
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    allocator = Allocator(engine, BUILTIN_CLASSES)  # no inventory: every claim waits
    try:
        async with sessions(engine)() as session, session.begin():
            await apply_quota_config(session, parse_quotas({"kind": "Quotas", "tenants": [
                {"name": "t", "maxPending": 2}, {"name": "u"}]}), "test")
        await allocator.transaction.decide([_submit("a", "m1", 1), _submit("b", "m2", 2), _submit("c", "m3", 3)])
        await allocator.transaction.decide([_release("a", "m4", 4), _submit("d", "m5", 5), _submit("e", "m6", 6)])
        async with sessions(engine)() as session:
            rows = {r.name: r for r in await session.scalars(select(Claim))}
        assert {n: r.state for n, r in rows.items()} == {
            "a": "Released", "b": "Pending", "c": "Rejected", "d": "Pending", "e": "Rejected"}
        assert rows["c"].reason is not None and "has 2 claims waiting, its maxPending of 2" in rows["c"].reason
    finally:
        await engine.dispose()


async def test_a_claim_submitted_again_with_another_spec_stays_and_says_so(ledger_url: str) -> None:
    """Claims are immutable: a second submission of a waiting or allocated claim changes nothing. The same
    document again is quiet (a re-send); another spec under its name gets an invalid-message alert on the
    tenant's alert subject, naming the claim, instead of silence."""
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    allocator = Allocator(engine, BUILTIN_CLASSES)
    bigger = _message(subjects.submit("t"), a_claim("c", "t").request(count=2).document(), "m3", 3)
    try:
        await allocator.transaction.decide([_submit("c", "m1", 1)])
        await allocator.transaction.decide([_submit("c", "m2", 2), bigger])
        async with sessions(engine)() as session:
            [row] = await session.scalars(select(Claim))
            alerts = [e.payload for e in await session.scalars(select(OutboxEvent)) if e.subject.startswith(
                subjects.alert("warning", "invalid-message", "t"))]
        assert '"count": 2' not in json.dumps(row.spec) and row.sequence >= 1  # the first spec stands
        [alert] = alerts
        assert "claim t/c was not applied" in alert["summary"] and "release it and submit again" in alert["summary"]
    finally:
        await engine.dispose()
