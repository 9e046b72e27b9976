"""The allocator's count of a tenant's claims preempted for fair share or reclaim in the last minute (what
maxPreemptionsPerMinute is checked against), on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.queue import recent_preemptions
from shared.ledger.schema import Claim, ClaimEvent
from shared.ledger.unit_of_work import unit_of_work

NOW = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


async def test_only_another_tenants_preemptions_of_the_last_minute_count(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    try:
        async with sessions(engine)() as s, s.begin():
            rows = {name: Claim(namespace=tenant, name=name, state="Pending", spec={}, sequence=1)
                    for tenant, name in (("vision", "a"), ("vision", "b"), ("vision", "c"), ("nlp", "d"))}
            s.add_all(rows.values())
            await s.flush()
            for name, ago, by in (("a", 10, "nlp/x"),  # counts
                                  ("b", 30, "speech/y"),  # counts
                                  ("c", 20, "vision/urgent"),  # priority within the tenant: not counted
                                  ("a", 90, "nlp/z"),  # too long ago
                                  ("d", 5, "vision/w")):  # nlp's
                s.add(ClaimEvent(claim_id=rows[name].id, at=NOW - timedelta(seconds=ago), sequence=2,
                                 state="Preempted", by=by))
            s.add(ClaimEvent(claim_id=rows["b"].id, at=NOW, sequence=3, state="Pending"))
        async with unit_of_work(sessions(engine)) as work:
            counted = await recent_preemptions(work, (NOW - timedelta(seconds=60)).timestamp())
        assert counted == {"vision": 2, "nlp": 1}
    finally:
        await engine.dispose()
