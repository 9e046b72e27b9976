"""The short chaos run of `make chaos`: the broker as deployed (one process per service, two allocator
replicas, PostgreSQL) while a replica is killed with SIGKILL, nats-server restarted and PostgreSQL's
backends terminated; every invariant count must be 0."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import chaos  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]


async def test_a_short_chaos_run_breaks_no_invariant(postgres_url: str) -> None:
    result = await chaos.run(claims=300, tenants=8, nodes=12, duration=15.0, kill_every=4.0, nats_restarts=1,
                             pg_terminations=1, seed=3)
    counts = {k: result[k] for k in ("devices_allocated_twice", "quota_breaches", "claims_lost",
                                     "statuses_disagreeing", "releases_lost", "claims_without_status")}
    assert counts == dict.fromkeys(counts, 0), result
    assert result["service_exits"] == [] and result["claims"] == 300, result
    assert result["faults"]["allocator_kills"] >= 3 and result["quota_samples"] >= 10, result
    assert result["recovery_max_s"] is not None and result["recovery_max_s"] < 5, result
