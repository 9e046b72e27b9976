"""Gangs through the allocator's decision transaction, on SQLite and PostgreSQL: the gang's state is the
ledger's (its members' rows), so members that arrive in different batches, or across an allocator restart,
form the same gang; an incomplete gang holds nothing; a complete one is Allocated whole in one decision; a
running member carries its gang, so preemption can take the gang whole."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select

from services.allocator.inventory import Heard
from services.allocator.service import Allocator
from shared.contract import subjects
from shared.dra.classes import BUILTIN_CLASSES
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.queue import load_queue
from shared.ledger.schema import Claim, DeviceAllocation
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
