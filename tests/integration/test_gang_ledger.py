"""Gangs through the allocator's decision transaction, on SQLite and PostgreSQL: the gang's state is the
ledger's (its members' rows), so members that arrive in different batches, or across an allocator restart,
form the same gang; an incomplete gang holds nothing; a complete one is Allocated whole in one decision; a
running member carries its gang, so preemption can take the gang whole."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import delete, event, select

from services.allocator.inventory import Heard
from services.allocator.service import Allocator
from shared.contract import subjects
from shared.dra.classes import BUILTIN_CLASSES
from shared.ledger import gang_waits, tenants
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.queue import load_queue
from shared.ledger.schema import Claim, DeviceAllocation
from shared.ledger.tenants import TenantSettings
from shared.ledger.unit_of_work import unit_of_work
from tests.builders import a_claim, fleet, node

FLEET = fleet(*node("n1", "H100", 4), *node("n2", "H100", 4))


def _submit(document: dict[str, Any], message_id: str, sequence: int) -> Any:
    return SimpleNamespace(subject=subjects.submit("t"), data=json.dumps(document).encode(),
                           headers={"Nats-Msg-Id": message_id},
                           metadata=SimpleNamespace(sequence=SimpleNamespace(stream=sequence)))


def _member(name: str, gpus: int = 4) -> dict[str, Any]:
    return a_claim(name, "t").request(count=gpus).gang("job", 2).document()


def _allocator(engine: Any) -> Allocator:
    """A fresh allocator (nothing in memory from an earlier one), with the fleet heard just now."""
    allocator = Allocator(engine, BUILTIN_CLASSES)
    allocator.inventory.fleet = FLEET
    allocator.inventory.heard = {name: Heard(1, time.time(), b"") for name in FLEET.nodes}
    return allocator


async def _rows(engine: Any) -> dict[str, Claim]:
    async with sessions(engine)() as session:
        return {row.name: row for row in await session.scalars(select(Claim))}


async def test_members_in_separate_batches_and_across_a_restart_form_one_gang(db_url: str) -> None:
    await migrate(db_url)
    engine = create_engine(db_url)
    try:
        await _allocator(engine).transaction.decide([_submit(_member("a"), "m1", 1)])
        rows = await _rows(engine)
        assert rows["a"].state == "Pending" and "gang job: 1 of 2 members received" in (rows["a"].reason or "")
        async with sessions(engine)() as session:
            assert await session.scalar(select(DeviceAllocation.device).limit(1)) is None  # it holds nothing

        restarted = _allocator(engine)  # the second member reaches another allocator: the ledger knows the first
        await restarted.transaction.decide([_submit(_member("b"), "m2", 2)])
        rows = await _rows(engine)
        assert {name: row.state for name, row in rows.items()} == {"a": "Allocated", "b": "Allocated"}
        assert {rows["a"].node, rows["b"].node} == {"n1", "n2"}  # 4 GPUs each: one node each
        async with unit_of_work(sessions(engine)) as work:
            held = await load_queue(work)
        assert {r.name: r.gang for r in held.running.values()} == {"a": "job", "b": "job"}
    finally:
        await engine.dispose()


async def test_an_incomplete_gang_holds_nothing_while_others_are_allocated(db_url: str) -> None:
    await migrate(db_url)
    engine = create_engine(db_url)
    try:
        plain = a_claim("plain", "t").request(count=4).document()
        await _allocator(engine).transaction.decide([_submit(_member("a"), "m1", 1), _submit(plain, "m2", 2)])
        rows = await _rows(engine)
        assert rows["a"].state == "Pending" and rows["plain"].state == "Allocated"
        await _allocator(engine).transaction.decide([_submit(_member("b"), "m3", 3)])
        rows = await _rows(engine)  # 4 free GPUs for 8 asked: neither member is allocated, none held half
        assert rows["a"].state == rows["b"].state == "Pending", {n: (r.state, r.reason) for n, r in rows.items()}
        assert "gang job" in (rows["b"].reason or "")
    finally:
        await engine.dispose()


# --- the gangs' clocks across a restart -------------------------------------------------------------------


class Clock:
    """The allocator's time, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Stream:
    """Claim messages in stream order, for any tenant."""

    def __init__(self) -> None:
        self.sequence = 0

    def _next(self, subject: str, body: dict[str, Any]) -> Any:
        self.sequence += 1
        return SimpleNamespace(subject=subject, data=json.dumps(body).encode(),
                               headers={"Nats-Msg-Id": f"m{self.sequence}"},
                               metadata=SimpleNamespace(sequence=SimpleNamespace(stream=self.sequence)))

    def submit(self, tenant: str, builder: Any) -> Any:
        return self._next(subjects.submit(tenant), builder.document())

    def release(self, tenant: str, name: str) -> Any:
        return self._next(subjects.release(tenant), {"name": name})


def _small(name: str) -> Any:
    """y's 1-GPU claim, not preemptible: the gang cannot take its place, only wait for it to end."""
    claim = a_claim(name, "y").request(count=1)
    claim.annotations["claimbroker.io/preemptible"] = "false"
    return claim


# four nodes: y's 16 claims give y a share of 16, more than x's 8 once its gang runs, so the gang is first
BIG = fleet(*(device for i in range(4) for device in node(f"n{i}", "H100", 4)))


def _clocked(engine: Any, clock: Clock) -> Allocator:
    """A fresh allocator on the test's clock (the fleet heard for as long as the test runs)."""
    allocator = Allocator(engine, BUILTIN_CLASSES, clock=clock, inventory_ttl=86400.0)
    allocator.inventory.fleet = BIG
    allocator.inventory.heard = {name: Heard(1, clock.now, b"") for name in BIG.nodes}
    return allocator


async def _gang_waits(engine: Any) -> dict[tuple[str, str], tuple[float | None, float | None]]:
    async with sessions(engine)() as session:
        return await gang_waits.load(session)


async def _states(engine: Any, tenant: str) -> dict[str, str]:
    return {name: row.state for name, row in (await _rows(engine)).items() if row.namespace == tenant}


@pytest.mark.parametrize("at_4m", ["restart", "quota-change", "restart-with-the-row-lost"])
async def test_a_starving_gangs_clock_survives_a_restart(db_url: str, at_4m: str) -> None:
    """x's gang of 2 x 4 GPUs waits behind y's 1-GPU claims on a full fleet of 4 x 4 (gangReserveAfter 5m,
    the default). It is first in x's order from T; at T+4m the allocator restarts (or a quota change has the
    cycle build its admission state anew); at T+5m a GPU frees. With its clock kept, the gang reserves it and
    y's next claim waits; once the rest end, the gang runs and its row goes. The control: with the row lost
    (as before the ledger kept it), its clock starts at the restart and y's claim takes the GPU."""
    await migrate(db_url)
    engine = create_engine(db_url)
    clock, stream = Clock(), Stream()
    try:
        allocator = _clocked(engine, clock)
        await allocator.transaction.decide([stream.submit("y", _small(f"y{i}")) for i in range(1, 17)])
        assert set((await _states(engine, "y")).values()) == {"Allocated"}
        start = clock.now
        await allocator.transaction.decide([
            stream.submit("x", a_claim("m1", "x").request(count=4).gang("job", 2)),
            stream.submit("x", a_claim("m2", "x").request(count=4).gang("job", 2)),
            stream.submit("y", _small("y17")), stream.submit("y", _small("y18"))])
        assert await _states(engine, "x") == {"m1": "Pending", "m2": "Pending"}
        assert await _gang_waits(engine) == {("x", "job"): (None, start)}, "first in x's order since T"

        clock.now = start + 60
        touched: list[str] = []

        def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if "gang_waits" in statement:
                touched.append(statement)

        event.listen(engine.sync_engine, "before_cursor_execute", record)
        await allocator.transaction.decide([])  # a cycle with nothing new: no statement on gang_waits
        event.remove(engine.sync_engine, "before_cursor_execute", record)
        assert touched == []
        assert await _gang_waits(engine) == {("x", "job"): (None, start)}

        clock.now = start + 240
        row_kept = at_4m != "restart-with-the-row-lost"
        if not row_kept:
            async with sessions(engine)() as session, session.begin():
                await gang_waits.write(session, {}, [("x", "job")])
        if at_4m == "quota-change":
            async with sessions(engine)() as session, session.begin():
                await tenants.put_tenant(session, "z", TenantSettings(None, 1.0, None, False, None, None, None))
        else:
            allocator = _clocked(engine, clock)  # restarted: nothing in memory
        await allocator.transaction.decide([stream.release("y", "y1")])
        assert (await _states(engine, "y"))["y17"] == "Allocated", "at 4m the gang keeps nothing yet"
        assert await _gang_waits(engine) == {("x", "job"): (None, start if row_kept else start + 240)}

        clock.now = start + 300
        await allocator.transaction.decide([stream.release("y", "y2")])
        rows = await _rows(engine)
        if not row_kept:
            assert rows["y18"].state == "Allocated", "its clock started again at the restart: 1m, not 5m"
            return
        assert rows["y18"].state == "Pending", (rows["y18"].reason, "the freed GPU is kept for the gang at 5m")
        assert rows["m1"].state == "Pending"

        clock.now = start + 360
        await allocator.transaction.decide([stream.release("y", f"y{i}") for i in range(3, 18)])
        assert await _states(engine, "x") == {"m1": "Allocated", "m2": "Allocated"}
        assert await _gang_waits(engine) == {}, "admitted: its row goes in the same transaction"
    finally:
        await engine.dispose()


async def test_a_gangs_row_goes_when_a_member_leaves(db_url: str) -> None:
    await migrate(db_url)
    engine = create_engine(db_url)
    clock, stream = Clock(), Stream()
    try:
        allocator = _clocked(engine, clock)
        await allocator.transaction.decide([stream.submit("y", _small(f"y{i}")) for i in range(1, 17)])
        await allocator.transaction.decide([
            stream.submit("x", a_claim("m1", "x").request(count=4).gang("job", 2)),
            stream.submit("x", a_claim("m2", "x").request(count=4).gang("job", 2))])
        assert await _gang_waits(engine) == {("x", "job"): (None, clock.now)}
        clock.now += 30
        await allocator.transaction.decide([stream.release("x", "m1")])
        assert await _gang_waits(engine) == {}, "incomplete: its clocks stop"

        # its members gone while the allocator was away: the row read back at start goes
        await allocator.transaction.decide([stream.submit("x", a_claim("m1", "x").request(count=4).gang("job", 2))])
        assert await _gang_waits(engine) == {("x", "job"): (None, clock.now)}, "complete again: counts from now"
        async with sessions(engine)() as session, session.begin():
            await session.execute(delete(Claim).where(Claim.namespace == "x"))
        await _clocked(engine, clock).transaction.decide([])
        assert await _gang_waits(engine) == {}
    finally:
        await engine.dispose()
