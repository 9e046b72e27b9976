"""Past use through the allocator's decision transaction, on SQLite and PostgreSQL (contract, Quotas:
`fairSharing.halfLife`; issue 41): the allocator counts what tenants hold while they hold it, whether or not
a cycle runs, writes it to the ledger, and a restarted allocator goes on from the ledger's figures, decayed
and with what was held meanwhile, rather than from nothing. A cohort's own quota changed in the ledger
reaches the next decision without a restart (config_revision)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from sqlalchemy import event, select, update

from services.allocator.inventory import Heard
from services.allocator.service import Allocator
from shared.admission.quota import parse_quotas
from shared.contract import subjects
from shared.dra.classes import BUILTIN_CLASSES
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.past_use import PastUseKeeper, past_use_now, read_rows
from shared.ledger.quota_store import apply_quota_config
from shared.ledger.schema import Claim, CohortQuotaRow
from tests.builders import a_claim, fleet, node

HOUR = 3600.0
H100_UNITS = 2.0  # the built-in H100 flavor's value
FLEET = fleet(*node("n1", "H100", 4), *node("n2", "H100", 4))


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


def _allocator(engine: Any, clock: Clock) -> Allocator:
    """A fresh allocator on the test's clock (nothing in memory from an earlier one)."""
    allocator = Allocator(engine, BUILTIN_CLASSES, clock=clock, inventory_ttl=30 * 86400.0)
    allocator.inventory.fleet = FLEET
    allocator.inventory.heard = {name: Heard(1, clock.now, b"") for name in FLEET.nodes}
    return allocator


async def _import(engine: Any, document: str) -> None:
    async with sessions(engine)() as session, session.begin():
        await apply_quota_config(session, parse_quotas(yaml.safe_load(document)), "test")


async def _past(engine: Any) -> tuple[dict[tuple[str, str], float], float | None]:
    """The ledger's rows, as written."""
    async with sessions(engine)() as session:
        return await read_rows(session, HOUR)


async def _states(engine: Any) -> dict[str, str]:
    async with sessions(engine)() as session:
        return {row.name: row.state for row in await session.scalars(select(Claim))}


HALF_LIFE_1H = """\
kind: Quotas
fairSharing: {halfLife: 1h}
tenants: [{name: x}, {name: y}]
"""


async def test_past_use_is_written_and_a_restart_goes_on_from_it(db_url: str) -> None:
    """x holds 4 H100s (8 GPU units) from T. One half-life later its past use is 4 in the ledger; the allocator
    restarts at T+2h, having run no transaction for that hour: the hour x held its devices counts (6, not 4
    decayed to 2, and not reset to 0). Released at T+2h, it halves to 3 by T+3h."""
    await migrate(db_url)
    engine = create_engine(db_url)
    clock, stream = Clock(), Stream()
    start = clock.now
    try:
        await _import(engine, HALF_LIFE_1H)
        allocator = _allocator(engine, clock)
        await allocator.transaction.decide([stream.submit("x", a_claim("big", "x").request(count=4))])
        assert await _states(engine) == {"big": "Allocated"}
        assert (await _past(engine))[0] == {}, "nothing held before T"

        clock.now = start + HOUR
        await allocator.transaction.decide([])  # nothing waits: no cycle, past use still steps
        past, as_of = await _past(engine)
        assert as_of == start + HOUR
        assert past == {("x", "H100"): pytest.approx(4 * H100_UNITS / 2, abs=1e-6)}

        clock.now = start + 2 * HOUR
        restarted = _allocator(engine, clock)
        await restarted.transaction.decide([])
        past, _ = await _past(engine)
        assert past == {("x", "H100"): pytest.approx(6.0, abs=1e-6)}, "the hour without an allocator counts"

        await restarted.transaction.decide([stream.release("x", "big")])
        clock.now = start + 3 * HOUR
        await restarted.transaction.decide([])
        past, _ = await _past(engine)
        assert past == {("x", "H100"): pytest.approx(3.0, abs=1e-6)}, "released: it halves"
        async with sessions(engine)() as session:  # what the usage views read: the same, at any time
            assert await past_use_now(session, start + 4 * HOUR, HOUR) == {
                ("x", "H100"): pytest.approx(1.5, abs=1e-6)}
    finally:
        await engine.dispose()


async def test_past_use_orders_tenants_after_a_restart(db_url: str) -> None:
    """x ran 8 GPU units for two half-lives and released them; after a restart, a claim of x and one of y
    arrive together for the one node left free: y, which ran nothing, is admitted first."""
    await migrate(db_url)
    engine = create_engine(db_url)
    clock, stream = Clock(), Stream()
    try:
        await _import(engine, HALF_LIFE_1H)
        allocator = _allocator(engine, clock)
        await allocator.transaction.decide([stream.submit("x", a_claim("ran", "x").request(count=4))])
        clock.now += 2 * HOUR
        await allocator.transaction.decide([stream.release("x", "ran")])
        restarted = _allocator(engine, clock)
        await restarted.transaction.decide([stream.submit("z", a_claim("fill", "z").request(count=4))])
        clock.now += 60
        await restarted.transaction.decide([stream.submit("x", a_claim("again", "x").request(count=4)),
                                            stream.submit("y", a_claim("first", "y").request(count=4))])
        states = await _states(engine)
        assert (states["first"], states["again"]) == ("Allocated", "Pending"), states
    finally:
        await engine.dispose()


async def test_no_half_life_writes_no_past_use(db_url: str) -> None:
    await migrate(db_url)
    engine = create_engine(db_url)
    clock, stream = Clock(), Stream()
    touched: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "past_use" in statement:
            touched.append(statement)

    try:
        allocator = _allocator(engine, clock)
        event.listen(engine.sync_engine, "before_cursor_execute", record)
        await allocator.transaction.decide([stream.submit("x", a_claim("big", "x").request(count=4))])
        clock.now += HOUR
        await allocator.transaction.decide([])
        event.remove(engine.sync_engine, "before_cursor_execute", record)
        assert touched == [], "without fairSharing.halfLife the allocator neither reads nor writes past use"
    finally:
        await engine.dispose()


async def test_past_use_rows_are_written_every_few_seconds_not_every_cycle(db_url: str) -> None:
    await migrate(db_url)
    engine = create_engine(db_url)
    clock, stream = Clock(), Stream()
    writes: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "past_use" in statement and not statement.lstrip().upper().startswith("SELECT"):
            writes.append(statement)

    try:
        await _import(engine, HALF_LIFE_1H)
        allocator = _allocator(engine, clock)
        await allocator.transaction.decide([stream.submit("x", a_claim("big", "x").request(count=4))])
        clock.now += 10
        await allocator.transaction.decide([])
        event.listen(engine.sync_engine, "before_cursor_execute", record)
        for _ in range(4):  # a second apart: within the 5 s between writes
            clock.now += 1
            await allocator.transaction.decide([])
        event.remove(engine.sync_engine, "before_cursor_execute", record)
        assert writes == []
        clock.now += 5
        await allocator.transaction.decide([])
        _, as_of = await _past(engine)
        assert as_of == clock.now
    finally:
        await engine.dispose()


TREE = """\
kind: Quotas
cohorts:
  - name: org
    quotas: {H100: {nominal: 4, borrowingLimit: 0}}
  - name: research
    parent: org
tenants:
  - name: x
    cohort: research
"""


async def test_a_cohorts_own_quota_changed_in_the_ledger_reaches_the_next_decision(db_url: str) -> None:
    """org's own quota of 4 H100s keeps x's second 4-GPU claim out (its reason names org); raised to 8 in the
    ledger, as the admin API or psql would, the running allocator admits it at its next decision."""
    await migrate(db_url)
    engine = create_engine(db_url)
    clock, stream = Clock(), Stream()
    try:
        await _import(engine, TREE)
        allocator = _allocator(engine, clock)
        await allocator.transaction.decide([stream.submit("x", a_claim("one", "x").request(count=4)),
                                            stream.submit("x", a_claim("two", "x").request(count=4))])
        async with sessions(engine)() as session:
            rows = {row.name: row for row in await session.scalars(select(Claim))}
        assert sorted(row.state for row in rows.values()) == ["Allocated", "Pending"]
        waiting = next(row for row in rows.values() if row.state == "Pending")
        assert "org" in (waiting.reason or ""), waiting.reason

        async with sessions(engine)() as session, session.begin():
            await session.execute(update(CohortQuotaRow).where(CohortQuotaRow.cohort == "org").values(nominal=8))
        clock.now += 1
        await allocator.transaction.decide([])
        assert set((await _states(engine)).values()) == {"Allocated"}
    finally:
        await engine.dispose()


async def test_a_rolled_back_transaction_leaves_past_use_as_it_was(db_url: str) -> None:
    """What a transaction stepped and wrote is the keeper's only once it commits: after a rollback the next
    step goes on from the last committed state (x still holding 8 units), and the ledger holds no row."""
    await migrate(db_url)
    engine = create_engine(db_url)
    keeper = PastUseKeeper(write_every=0.0)
    start = 1_800_000_000.0
    try:
        async with sessions(engine)() as session, session.begin():
            assert await keeper.step(session, start, HOUR) == {}
            keeper.holds({("x", "H100"): 8.0})
        keeper.committed()
        async with sessions(engine)() as session:
            await session.begin()
            assert await keeper.step(session, start + HOUR, HOUR) == {("x", "H100"): pytest.approx(4.0)}
            keeper.holds({})  # as if x's claim ended in this transaction
            await keeper.write(session)
            await session.rollback()
        keeper.rolled_back()
        async with sessions(engine)() as session, session.begin():
            assert await keeper.step(session, start + 2 * HOUR, HOUR) == {("x", "H100"): pytest.approx(6.0)}
        assert (await _past(engine))[0] == {}
    finally:
        await engine.dispose()
