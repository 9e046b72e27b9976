"""Start estimates live (issue 39), with a real nats-server and the ledger on SQLite and PostgreSQL: a claim
that waits behind running claims with a claimbroker.io/expected-runtime gets an estimatedStart on its status
subject (a Pending status of its own, the next sequence, valid as the contract's ClaimStatus), a release
that lets it start sooner republishes a lower one, and at its start the error of its first and last
estimates is kept."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.publish import publish_json
from shared.contract import subjects
from shared.contract.messages import read_status
from shared.ledger.engine import sessions
from shared.ledger.estimates import estimate_errors
from shared.ledger.schema import Claim
from tests.builders import a_claim
from tests.e2e.helpers import statuses
from tests.e2e.test_allocator_semantics import broker, submit

pytestmark = pytest.mark.e2e


def claim(name: str, gpus: int, runtime: str) -> dict[str, Any]:
    builder = a_claim(name, "team").request(count=gpus)
    builder.annotations["claimbroker.io/expected-runtime"] = runtime
    return builder.document()


def unix(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


async def test_a_waiting_claim_gets_an_estimate_and_a_release_lowers_it(nats_server: EmbeddedNats, db_url: str,
                                                                         tmp_path: Path) -> None:
    async with broker(nats_server, db_url, tmp_path) as b:
        allocator = await b.start_allocator(estimate_interval=0.1)
        nc = await connect(b.url, name="tenant")
        seen = await statuses(nc)
        await submit(nc, claim("busy-1", 1, "1h"), "id-busy-1")
        await submit(nc, claim("busy-2", 1, "2h"), "id-busy-2")
        await seen.wait_for(lambda: all(seen.latest().get(("team", n), {}).get("state") == "Allocated"
                                        for n in ("busy-1", "busy-2")))
        started = {n: seen.latest()[("team", n)]["observedAt"] for n in ("busy-1", "busy-2")}
        await submit(nc, claim("big", 2, "30m"), "id-big")  # the whole node: after both end

        def estimates() -> list[dict[str, Any]]:
            return [s for s in seen.for_claim("team", "big") if s.get("estimatedStart")]

        await seen.wait_for(lambda: len(estimates()) >= 1)
        first = estimates()[0]
        assert first["state"] == "Pending" and first["reason"]
        read_status(json.dumps(first))  # the contract's schema
        answered = [s for s in seen.for_claim("team", "big") if s["sequence"] < first["sequence"]]
        assert answered and answered[-1]["reason"] == first["reason"], "same state and reason, the next sequence"
        assert first["sequence"] == answered[-1]["sequence"] + 1
        p50 = unix(first["estimatedStart"]["p50"])
        assert abs(p50 - (unix(started["busy-2"]) + 7200)) < 5, "when busy-2 ends, 2 h after it started"
        assert set(first["estimatedStart"]["blockedBy"]) == {"team/busy-1", "team/busy-2"}

        await publish_json(nc.jetstream(), subjects.release("team"), {"name": "busy-2"}, msg_id="release-busy-2")
        await seen.wait_for(lambda: any(s["estimatedStart"] != first["estimatedStart"] for s in estimates()))
        lowered = next(s for s in estimates() if s["estimatedStart"] != first["estimatedStart"])
        assert lowered["state"] == "Pending"
        assert abs(unix(lowered["estimatedStart"]["p50"]) - (unix(started["busy-1"]) + 3600)) < 5, (
            "busy-2 gone: when busy-1 ends, 1 h after it started")
        assert lowered["sequence"] > first["sequence"]
        assert lowered["estimatedStart"]["blockedBy"] == ["team/busy-1"]
        async with sessions(b.engine)() as session:
            row = (await session.execute(select(Claim.estimated_start, Claim.estimate_p50, Claim.first_estimate_p50)
                                         .where(Claim.name == "big"))).one()
        assert row.estimated_start == lowered["estimatedStart"]
        assert row.first_estimate_p50 == pytest.approx(p50, abs=1)
        assert allocator.estimator is not None and allocator.estimator.figures is not None

        # busy-1 ends an hour early: big starts, and its estimates' error is kept against its start
        await publish_json(nc.jetstream(), subjects.release("team"), {"name": "busy-1"}, msg_id="release-busy-1")
        await seen.wait_for(lambda: seen.latest()[("team", "big")]["state"] == "Allocated")
        assert "estimatedStart" not in seen.latest()[("team", "big")]
        async with sessions(b.engine)() as session:
            [error] = await estimate_errors(session, time.time() - 3600)
        assert error.tenant == "team"
        assert error.last == pytest.approx(time.time() - unix(lowered["estimatedStart"]["p50"]), abs=30)
        assert error.first is not None and error.first < error.last < 0, (
            "both estimates were later than its start (the claims ended early), the first by more")
        await nc.close()
