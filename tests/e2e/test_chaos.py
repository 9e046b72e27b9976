"""The short chaos run of `make chaos`: the broker as deployed (one process per service, two allocator
replicas, PostgreSQL) while a replica is killed with SIGKILL, nats-server restarted, PostgreSQL's
backends terminated and PostgreSQL itself restarted; every invariant count must be 0."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import chaos  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]


async def test_a_short_chaos_run_breaks_no_invariant(postgres_url: str) -> None:
    result = await chaos.run(claims=300, tenants=8, nodes=12, duration=15.0, kill_every=4.0, nats_restarts=1,
                             pg_terminations=1, pg_restarts=1, seed=3)
    counts = {k: result[k] for k in ("devices_allocated_twice", "quota_breaches", "claims_lost",
                                     "statuses_disagreeing", "releases_lost", "claims_without_status", "claims_stuck")}
    assert counts == dict.fromkeys(counts, 0), json.dumps(result)  # whole: its examples say where it went wrong
    assert result["service_exits"] == [] and result["claims"] == 300, result
    assert result["faults"]["pg_restarts"] == 1, result
    assert result["faults"]["allocator_kills"] >= 3 and result["quota_samples"] >= 10, result
    assert result["recovery_max_s"] is not None and result["recovery_max_s"] < 5, result


async def test_the_stuck_check_finds_a_claim_the_allocator_should_have_admitted(tmp_path: Path) -> None:
    """The checker's `claims_stuck` is not vacuous: a Pending claim with free devices for it is found; one
    that asks more than the fleet has waits rightly and is not."""
    from sqlalchemy import update

    from shared.admission.quota import QuotaConfig
    from shared.dra.classes import BUILTIN_CLASSES
    from shared.dra.inventory import Fleet
    from shared.fleet.sources import load_inventory
    from shared.ledger.engine import create_engine, migrate, sessions
    from shared.ledger.schema import Claim
    from tests.builders import a_claim
    from tests.e2e.test_allocator_semantics import SLICE

    inventory = tmp_path / "slices.yaml"
    inventory.write_text(SLICE)
    documents = load_inventory([inventory])
    fleet = Fleet.from_slices(documents.slices, documents.labels)
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await migrate(url)
    engine = create_engine(url)
    try:
        async with sessions(engine)() as session, session.begin():
            session.add(Claim(namespace="team", name="waits", state="Pending", sequence=1, reason="(missed)",
                              spec=a_claim("waits", "team").request().document()))
        async with sessions(engine)() as session:
            assert await chaos.missed_admissions(session, fleet, list(BUILTIN_CLASSES.values()),
                                                 QuotaConfig()) == ["team/waits"]
        async with sessions(engine)() as session, session.begin():  # 3 GPUs of a 2-GPU node
            await session.execute(update(Claim).values(spec=a_claim("waits", "team").request(count=3).document()))
        async with sessions(engine)() as session:
            assert await chaos.missed_admissions(session, fleet, [], QuotaConfig()) == []
    finally:
        await engine.dispose()
