"""POST /v1/whatif with tree edits and a changed half-life (issue 41): cohorts added or re-parented on
today's configuration decide the proposal, a cycle or an unknown parent is a 422 naming the cohorts, and a
changed fairSharing.halfLife counts the ledger's past use in the shares after; nothing is written."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from services.admin_api.app import create_app
from shared.admission.cycle import run_cycle
from shared.admission.model import Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.ledger.engine import create_engine, sessions
from shared.ledger.schema import AuditEntry, Claim, Cohort, PastUse, Tenant
from shared.ledger.tokens import create_token
from tests.builders import a_claim, fleet, node

FLEET = fleet(*node("a", "H100", 2), *node("b", "H100", 2))
ONE_MORE_NODE = {"kind": "Topology", "nodes": [{"name": "c", "gpuModel": "H100", "gpuCount": 2}]}


@pytest.fixture
async def api(ledger_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str], Any]]:
    """vision (in cohort team) runs four 1-GPU claims on the 4 H100s and waits with a fifth; it held 10 GPU
    units in the past, as the ledger's past use says now."""
    engine = create_engine(ledger_url)
    factory = sessions(engine)
    claims = [a_claim(f"c{i}", "vision").request() for i in range(5)]
    decided = run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, QuotaConfig(), (),
                                 tuple(Waiting("vision", c.build().metadata.name, c.build(), 0, True, i)
                                       for i, c in enumerate(claims))))
    async with factory() as s, s.begin():
        s.add(Cohort(name="team"))
        await s.flush()
        s.add(Tenant(name="vision", cohort="team", weight=1.0))
        s.add(PastUse(tenant="vision", flavor="H100", units=10.0, as_of=time.time()))
        for i, d in enumerate(decided.decisions):
            allocation = d.decision.allocation
            s.add(Claim(namespace="vision", name=d.name, spec=claims[i].document(), sequence=1, arrival=i,
                        state="Allocated" if allocation else "Pending",
                        allocation=allocation.to_json() if allocation else None,
                        node=allocation.node if allocation else None))
    admin = {"Authorization": f"Bearer {await create_token(factory, 'admin', None)}"}

    async def fleet_view() -> Fleet:
        return FLEET

    transport = httpx.ASGITransport(app=create_app(engine, fleet=fleet_view))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client, admin, factory
    await engine.dispose()


async def test_a_cohort_put_under_a_capped_parent_keeps_the_waiting_claim_out(api: tuple[Any, ...]) -> None:
    client, admin, _ = api
    free = await client.post("/v1/whatif", json={"addInventory": [ONE_MORE_NODE]}, headers=admin)
    assert free.json()["pending"]["vision"] == {"before": 1, "after": 0}, "a node more: the fifth claim runs"
    capped = await client.post("/v1/whatif", headers=admin, json={"addInventory": [ONE_MORE_NODE], "cohorts": [
        {"name": "org", "quotas": {"H100": {"nominal": 4, "borrowingLimit": 0}}},
        {"name": "team", "parent": "org"}]})
    assert capped.status_code == 200, capped.text
    assert capped.json()["pending"]["vision"] == {"before": 1, "after": 1}, "org's 4 H100s, nothing borrowed"


@pytest.mark.parametrize(("cohorts", "detail"), [
    ([{"name": "org", "parent": "team"}, {"name": "team", "parent": "org"}], "team -> org -> team"),
    ([{"name": "team", "parent": "nowhere"}], "'nowhere'"),
    ([{"parent": "team"}], "name"),
])
async def test_a_cycle_or_an_unknown_parent_is_a_422_naming_the_cohorts(api: tuple[Any, ...],
                                                                       cohorts: list[dict[str, Any]],
                                                                       detail: str) -> None:
    client, admin, factory = api
    refused = await client.post("/v1/whatif", json={"cohorts": cohorts}, headers=admin)
    assert refused.status_code == 422 and refused.headers["content-type"] == "application/problem+json"
    assert detail in refused.json()["detail"], refused.json()
    async with factory() as s:
        assert await s.scalar(select(func.count()).select_from(Cohort)) == 1
        assert await s.scalar(select(func.count()).select_from(AuditEntry).where(
            AuditEntry.entity.not_like("token/%"))) == 0


async def test_a_changed_half_life_counts_past_use_in_the_shares_after(api: tuple[Any, ...]) -> None:
    """Today without a half-life vision's share is its 8 units in use; with one, its 10 of past use too."""
    client, admin, _ = api
    answer = (await client.post("/v1/whatif", json={"halfLife": 3600}, headers=admin)).json()
    assert answer["shares"]["vision"]["before"] == pytest.approx(8.0)
    assert answer["shares"]["vision"]["after"] == pytest.approx(18.0, abs=0.01)
    assert (await client.post("/v1/whatif", json={"halfLife": -1}, headers=admin)).status_code == 422
