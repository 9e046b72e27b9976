"""Start estimates outside the allocator read what a decision cycle reads (services/allocator/ledger_snapshots.py):
a snapshot of the ledger's queue and quotas and the bus's fleet, built again only when the queue or the fleet
moved; none while nothing waits. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

from services.allocator.ledger_snapshots import LedgerSnapshots
from shared.dra.classes import merge_classes
from shared.dra.inventory import Fleet
from shared.dra.results import State
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import Claim
from shared.ledger.unit_of_work import unit_of_work
from tests.builders import a_claim, node
from tests.builders import fleet as a_fleet


def _spec(name: str) -> dict[str, Any]:
    return json.loads(a_claim(name, "t").request().build().model_dump_json(by_alias=True, exclude_none=True))


async def test_a_snapshot_is_read_again_only_when_the_queue_or_the_fleet_moved(db_url: str) -> None:
    await migrate(db_url)
    engine = create_engine(db_url)
    make = sessions(engine)
    fleet: Fleet = a_fleet(*node("n1", "H100", 2))

    async def the_fleet() -> Fleet:
        return fleet  # as the bus has it now

    snapshots = LedgerSnapshots(make, the_fleet, merge_classes([]), inventory_ttl=1e9, min_runtime=0.0,
                                gang_reserve_after=300.0, clock=lambda: 1000.0)
    try:
        await snapshots.refresh()
        assert snapshots.committed_snapshot is None and snapshots.changes == 1  # nothing waits

        async with make() as session, session.begin():
            session.add(Claim(namespace="t", name="c0", state=State.PENDING.value, spec=_spec("c0"), priority=0,
                              sequence=0, arrival=1))
        await snapshots.refresh()
        first = snapshots.committed_snapshot
        assert first is not None and [w.name for w in first.waiting] == ["c0"] and snapshots.changes == 2
        assert set(first.fleet.nodes) == {"n1"} and first.now == 1000.0

        await snapshots.refresh()  # nothing moved: the same snapshot, no change counted
        assert snapshots.committed_snapshot is first and snapshots.changes == 2

        async with unit_of_work(make) as work:  # another claim queued
            work.session.add(Claim(namespace="t", name="c1", state=State.PENDING.value, spec=_spec("c1"),
                                   priority=0, sequence=0, arrival=2))
        await snapshots.refresh()
        assert snapshots.committed_snapshot is not None and snapshots.changes == 3
        assert sorted(w.name for w in snapshots.committed_snapshot.waiting) == ["c0", "c1"]

        fleet = a_fleet(*node("n1", "H100", 2), *node("n2", "H100", 2))  # a node came
        await snapshots.refresh()
        assert snapshots.changes == 4 and set(snapshots.committed_snapshot.fleet.nodes) == {"n1", "n2"}
    finally:
        await engine.dispose()
