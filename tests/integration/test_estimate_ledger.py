"""Start estimates in the ledger, on SQLite and PostgreSQL: the runtimes observed (an Allocated status to the
Released one right after it), an estimate written as the claim's next status only while it is still
Pending and answered (a decision that took it first wins, and one in flight is waited for), and the
estimate, or a null one with its reason, carried by later Pending statuses, cleared by an allocation."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from shared.admission.estimates import UNSATISFIABLE
from shared.contract.messages import read_status
from shared.dra.results import Allocation, Decision, DeviceResult, State
from shared.ledger.decisions import claim_rows
from shared.ledger.engine import create_engine, sessions
from shared.ledger.estimates import (
    EstimateWrite,
    estimate_errors,
    observed_runtimes,
    published_estimates,
    write_estimates,
)
from shared.ledger.queue import load_queue
from shared.ledger.schema import Claim, ClaimEvent, OutboxEvent
from shared.ledger.unit_of_work import unit_of_work
from tests.builders import a_claim

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _spec(name: str) -> dict[str, Any]:
    return json.loads(a_claim(name, "t").request().build().model_dump_json(by_alias=True, exclude_none=True))


def _claim(name: str, state: str, *, reason: str | None = "waits", sequence: int = 1, tenant: str = "t",
           **more: Any) -> Claim:
    return Claim(namespace=tenant, name=name, state=state, spec=_spec(name), sequence=sequence, reason=reason, **more)


async def test_observed_runtimes_are_allocated_to_released(ledger_url: str) -> None:
    engine = create_engine(ledger_url)
    make = sessions(engine)
    at = lambda minutes: T0 + timedelta(minutes=minutes)  # noqa: E731
    # per claim: its row, and its history (sequence, state, minutes)
    claims = {
        "ran": (dict(state="Released", flavor="h100", allocated_at=at(0)),
                [(1, "Pending", -5), (2, "Allocated", 0), (3, "Released", 10)]),
        "preempted-then-released": (dict(state="Released", flavor="h100", allocated_at=at(0)),
                                    [(1, "Allocated", 0), (2, "Preempted", 3), (3, "Pending", 3),
                                     (4, "Released", 20)]),
        "running": (dict(state="Allocated", flavor="h100", allocated_at=at(0)), [(1, "Allocated", 0)]),
        "long-ago": (dict(state="Released", flavor="h100", allocated_at=at(-60 * 24 * 30)),
                     [(1, "Allocated", -60 * 24 * 30), (2, "Released", -60 * 24 * 30 + 5)]),
        "other-flavor": (dict(state="Released", flavor=None, allocated_at=at(1)),
                         [(1, "Allocated", 1), (2, "Released", 3)]),
    }
    try:
        async with make() as session, session.begin():
            for name, (row, history) in claims.items():
                claim = _claim(name, **row)
                session.add(claim)
                await session.flush()
                for sequence, state, minutes in history:
                    session.add(ClaimEvent(claim_id=claim.id, sequence=sequence, state=state, at=at(minutes)))
        async with unit_of_work(make) as work:
            runs = await observed_runtimes(work, (T0 - timedelta(days=14)).timestamp())
            assert sorted(runs, key=str) == [("t", "h100", 600.0), ("t", None, 120.0)]
            assert await observed_runtimes(work, (T0 - timedelta(days=14)).timestamp(), limit=1) == [
                ("t", None, 120.0)], "the latest allocated first"
    finally:
        await engine.dispose()


async def _outbox(make: Any) -> list[dict[str, Any]]:
    async with make() as session:
        return [p for p in await session.scalars(select(OutboxEvent.payload).order_by(OutboxEvent.id))]


async def test_an_estimate_is_the_next_status_of_a_claim_still_pending(ledger_url: str) -> None:
    engine = create_engine(ledger_url)
    make = sessions(engine)
    estimate = {"p50": "2026-12-01T12:20:00Z", "p90": "2026-12-01T12:30:00Z", "blockedBy": ["t/busy"]}
    p50 = datetime(2026, 12, 1, 12, 20, tzinfo=UTC).timestamp()
    try:
        async with make() as session, session.begin():
            session.add_all([_claim("waits", "Pending", sequence=3), _claim("unanswered", "Pending", reason=None),
                             _claim("runs", "Allocated", reason=None), _claim("waits", "Pending", tenant="u"),
                             _claim("runs", "Pending", tenant="u"),
                             _claim("never", "Pending", explain={"unsatisfiable": True})])
        async with unit_of_work(make) as work:
            early = await write_estimates(work, "default", [EstimateWrite("t", "waits", estimate, p50)])
            assert early.claims == [], "nothing before the first decision transaction"
            await work.take_turn("default", "me", T0.timestamp() + 60)
        async with unit_of_work(make) as work:
            written = (await write_estimates(work, "default", [
                EstimateWrite("t", name, estimate, p50) for name in ("waits", "unanswered", "runs", "gone")])).claims
        assert written == [("t", "waits")], "only t's: u's claims of the same names are not asked for"
        async with unit_of_work(make) as work:  # an estimate gone null on a claim the fleet cannot satisfy now
            assert (await write_estimates(work, "default", [EstimateWrite("t", "never", None, None, UNSATISFIABLE)])
                    ).claims == [("t", "never")]
        async with make() as session:
            assert [s for s in await session.scalars(select(Claim.sequence).where(Claim.namespace == "u"))] == [1, 1]
        async with make() as session:
            row = await session.scalar(select(Claim).where(Claim.namespace == "t", Claim.name == "waits"))
            assert row is not None
            assert (row.sequence, row.state, row.reason, row.estimated_start, row.estimate_p50,
                    row.first_estimate_p50) == (4, "Pending", "waits", estimate, p50, p50)
            history = (await session.execute(select(ClaimEvent.sequence, ClaimEvent.state, ClaimEvent.reason)
                                             .where(ClaimEvent.claim_id == row.id))).all()
            assert [tuple(h) for h in history] == [(4, "Pending", "waits")]
        status, never = await _outbox(make)
        assert (status["state"], status["reason"], status["sequence"], status["estimatedStart"]) == (
            "Pending", "waits", 4, estimate)
        assert "unsatisfiable" not in status
        assert (never["name"], never["estimatedStart"], never["unsatisfiable"]) == ("never", None, True), (
            "the mark its last decision gave it stays: the notifier resolves its alert on a status without")
        assert never["estimatedStartReason"] == UNSATISFIABLE, "a null says why"
        assert read_status(json.dumps(never)) == never, "the contract's status model reads it"
        assert "estimatedStartReason" not in status
        async with unit_of_work(make) as work:
            assert await published_estimates(work) == {("t", "waits"): p50, ("t", "never"): None}
        # checked against the row (another allocator published it): a move of less than a tenth is not written
        now = p50 - 1200
        async with unit_of_work(make) as work:
            done = await write_estimates(work, "default", [EstimateWrite("t", "waits", estimate, p50 + 100)], now=now)
            assert (done.claims, done.held) == ([], {("t", "waits"): p50})
            done = await write_estimates(work, "default", [EstimateWrite("t", "waits", estimate, p50 + 130)], now=now)
            assert done.claims == [("t", "waits")]
        # a second one moves the last, not the first
        async with unit_of_work(make) as work:
            await write_estimates(work, "default", [EstimateWrite("t", "waits", None, None)])
            assert await published_estimates(work) == {("t", "never"): None}, "a null without a reason is none"
        async with make() as session:
            row = await session.scalar(select(Claim).where(Claim.namespace == "t", Claim.name == "waits"))
            assert row is not None
            assert (row.sequence, row.estimated_start, row.estimate_p50, row.first_estimate_p50) == (6, None, None, p50)
    finally:
        await engine.dispose()


async def test_a_decision_in_flight_is_waited_for_and_wins(ledger_url: str) -> None:
    engine = create_engine(ledger_url)
    make = sessions(engine)
    estimate = {"p50": "2026-12-01T12:20:00Z", "p90": None, "blockedBy": []}
    try:
        async with make() as session, session.begin():
            session.add(_claim("a", "Pending", sequence=1))
        async with unit_of_work(make) as work:  # an earlier decision transaction: the lease row is there
            await work.take_turn("default", "me", T0.timestamp() + 60)
        async with unit_of_work(make) as decision:
            await decision.take_turn("default", "me", T0.timestamp() + 60)
            queue = await load_queue(decision)
            rows = await claim_rows(decision, queue, [("t", "a")])
            row = rows[("t", "a")]
            decision.writes.decision(row, Decision(State.ALLOCATED, Allocation(
                "n1", (DeviceResult("gpu", "gpu.nvidia.com", "n1", "gpu-0"),))))
            decision.writes.status(row)
            await decision.flush()

            async def estimate_now() -> list[tuple[str, str]]:
                async with unit_of_work(make) as work:
                    return (await write_estimates(work, "default", [EstimateWrite("t", "a", estimate, 1.0)])).claims

            writer = asyncio.create_task(estimate_now())
            done, _ = await asyncio.wait({writer}, timeout=0.3)
            assert not done, "the estimate waits for the decision transaction holding the shard's turn"
        assert await writer == [], "the claim is Allocated now: no estimate is written"
        async with make() as session:
            got = (await session.execute(select(Claim.state, Claim.sequence).where(Claim.name == "a"))).one()
            assert tuple(got) == ("Allocated", 2)
        assert [s["sequence"] for s in await _outbox(make)] == [2]
    finally:
        await engine.dispose()


async def _one_waiting_claim(make: Any) -> None:
    """Claim t/a, Pending at sequence 1, and the shard's lease taken once (estimates are written under it)."""
    async with make() as session, session.begin():
        session.add(_claim("a", "Pending", sequence=1))
    async with unit_of_work(make) as work:
        await work.take_turn("default", "me", T0.timestamp() + 60)


async def test_pending_statuses_carry_the_estimate_until_allocated(ledger_url: str) -> None:
    engine = create_engine(ledger_url)
    make = sessions(engine)
    estimate = {"p50": "2026-12-01T12:20:00Z", "p90": None, "blockedBy": []}
    p50 = T0.timestamp()
    try:
        await _one_waiting_claim(make)
        async with unit_of_work(make) as work:
            await write_estimates(work, "default", [EstimateWrite("t", "a", estimate, p50)])
        async with unit_of_work(make) as work:  # a reason worked out again: a Pending decision
            queue = await load_queue(work)
            row = (await claim_rows(work, queue, [("t", "a")]))[("t", "a")]
            work.writes.decision(row, Decision(State.PENDING, reason="waits longer"))
            work.writes.status(row)
        async with unit_of_work(make) as work:
            queue = await load_queue(work)
            row = (await claim_rows(work, queue, [("t", "a")]))[("t", "a")]
            work.writes.decision(row, Decision(State.ALLOCATED, Allocation(
                "n1", (DeviceResult("gpu", "gpu.nvidia.com", "n1", "gpu-0"),))))
            row.allocated_at = datetime.fromtimestamp(p50 + 90, UTC)
            work.writes.status(row)
        statuses = await _outbox(make)
        assert [(s["state"], s.get("estimatedStart")) for s in statuses] == [
            ("Pending", estimate), ("Pending", estimate), ("Allocated", None)]
        async with make() as session:
            kept = (await session.execute(select(Claim.estimated_start, Claim.estimate_p50)
                                          .where(Claim.name == "a"))).one()
            assert tuple(kept) == (None, p50), "the p50 stays after allocation: the estimates' error"
        async with unit_of_work(make) as work:  # preempted: back in the queue, with no estimate of this wait yet
            await work.session.execute(update(Claim).where(Claim.name == "a").values(state="Pending"))
            assert await published_estimates(work) == {}
        async with unit_of_work(make) as work:
            [error] = await estimate_errors(work.session, p50 - 3600)
            assert await estimate_errors(work.session, p50 - 3600, tenant="other") == []
            assert (error.tenant, error.first, error.last) == ("t", 90.0, 90.0)
    finally:
        await engine.dispose()


async def test_a_null_estimate_keeps_its_reason_until_allocated(ledger_url: str) -> None:
    engine = create_engine(ledger_url)
    make = sessions(engine)
    estimate = {"p50": "2026-12-01T12:20:00Z", "p90": None, "blockedBy": []}
    p50 = T0.timestamp()
    try:
        await _one_waiting_claim(make)
        async with unit_of_work(make) as work:
            assert (await write_estimates(work, "default", [EstimateWrite("t", "a", None, None, UNSATISFIABLE)])
                    ).claims == [("t", "a")]
        async with unit_of_work(make) as work:
            assert await published_estimates(work) == {("t", "a"): None}, (
                "a restarted estimator knows the null was published")
            again = await write_estimates(work, "default", [EstimateWrite("t", "a", None, None, UNSATISFIABLE)],
                                          now=p50)
            assert (again.claims, again.held) == ([], {("t", "a"): None}), "nor does another allocator write it twice"

        async def pending_decision(reason: str) -> None:
            async with unit_of_work(make) as work:
                queue = await load_queue(work)
                row = (await claim_rows(work, queue, [("t", "a")]))[("t", "a")]
                work.writes.decision(row, Decision(State.PENDING, reason=reason))
                work.writes.status(row)

        await pending_decision("waits longer")
        async with make() as session:
            assert (await session.scalar(select(Claim.estimate_reason).where(Claim.name == "a"))) == UNSATISFIABLE
        async with unit_of_work(make) as work:  # a value now: the reason goes
            await write_estimates(work, "default", [EstimateWrite("t", "a", estimate, p50)], now=p50 - 600)
            assert await published_estimates(work) == {("t", "a"): p50}
        await pending_decision("waits on")
        async with unit_of_work(make) as work:  # null again, then allocated: both go
            await write_estimates(work, "default", [EstimateWrite("t", "a", None, None, UNSATISFIABLE)], now=p50 - 600)
        await pending_decision("waits still")
        async with unit_of_work(make) as work:
            queue = await load_queue(work)
            row = (await claim_rows(work, queue, [("t", "a")]))[("t", "a")]
            work.writes.decision(row, Decision(State.ALLOCATED, Allocation(
                "n1", (DeviceResult("gpu", "gpu.nvidia.com", "n1", "gpu-0"),))))
            work.writes.status(row)
        statuses = await _outbox(make)
        assert [(s["reason"], s.get("estimatedStart", "-"), s.get("estimatedStartReason")) for s in statuses] == [
            ("waits", None, UNSATISFIABLE), ("waits longer", None, UNSATISFIABLE), ("waits longer", estimate, None),
            ("waits on", estimate, None), ("waits on", None, UNSATISFIABLE), ("waits still", None, UNSATISFIABLE),
            (None, "-", None)], "each later Pending status says it as it was published; the allocation neither"
        for status in statuses:
            assert read_status(json.dumps(status)) == status
        async with make() as session:
            kept = (await session.execute(select(Claim.estimated_start, Claim.estimate_reason)
                                          .where(Claim.name == "a"))).one()
            assert tuple(kept) == (None, None)
        async with unit_of_work(make) as work:  # preempted: back in the queue, no estimate of this wait yet
            await work.session.execute(update(Claim).where(Claim.name == "a").values(state="Pending"))
            assert await published_estimates(work) == {}
    finally:
        await engine.dispose()


async def test_a_null_estimate_whose_reason_changed_is_written_again(ledger_url: str) -> None:
    """The row check lets a null through again only with another reason: another allocator or a restarted
    estimator writes the same null once, a changed one once more."""
    engine = create_engine(ledger_url)
    make = sessions(engine)
    beyond = "it does not start within 7d of the claims running now"
    try:
        await _one_waiting_claim(make)
        for reason, written in ((UNSATISFIABLE, True), (UNSATISFIABLE, False), (beyond, True), (beyond, False)):
            async with unit_of_work(make) as work:
                done = await write_estimates(work, "default", [EstimateWrite("t", "a", None, None, reason)],
                                             now=T0.timestamp())
            assert done.claims == ([("t", "a")] if written else []), (reason, written)
        assert [s.get("estimatedStartReason") for s in await _outbox(make)] == [UNSATISFIABLE, beyond]
    finally:
        await engine.dispose()
