"""POST /v1/whatif: the ledger's claims and quotas and the fleet the process sees, with proposed changes;
admins only, a wrong proposal a 422 naming it, and nothing written."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import func, select

from services.admin_api.app import create_app
from shared.admission.cycle import run_cycle
from shared.admission.model import Snapshot, Waiting
from shared.admission.quota import QuotaConfig
from shared.dra.classes import BUILTIN_CLASSES
from shared.dra.inventory import Fleet
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import AuditEntry, Claim
from shared.ledger.tokens import create_token
from tests.builders import a_claim, fleet, node

FLEET = fleet(*node("a", "H100", 2), *node("b", "H100", 2))


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str], dict[str, str], object]]:
    await migrate(db_url)
    engine = create_engine(db_url)
    factory = sessions(engine)
    claims = [a_claim(f"c{i}", "vision").request() for i in range(5)]
    decided = run_cycle(Snapshot(FLEET, BUILTIN_CLASSES, QuotaConfig(), (),
                                 tuple(Waiting("vision", c.build().metadata.name, c.build(), 0, True, i)
                                       for i, c in enumerate(claims))))
    async with factory() as s, s.begin():
        for i, d in enumerate(decided.decisions):
            allocation = d.decision.allocation
            s.add(Claim(namespace="vision", name=d.name, spec=claims[i].document(), sequence=1, arrival=i,
                        state="Allocated" if allocation else "Pending",
                        allocation=allocation.to_json() if allocation else None,
                        node=allocation.node if allocation else None))
    admin = {"Authorization": f"Bearer {await create_token(factory, 'admin', None)}"}
    viewer = {"Authorization": f"Bearer {await create_token(factory, 'viewer', None)}"}

    async def fleet_view() -> Fleet:
        return FLEET

    transport = httpx.ASGITransport(app=create_app(engine, fleet=fleet_view))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
        yield api, admin, viewer, factory
    await engine.dispose()


async def test_a_drain_and_a_cut_quota_answered_and_nothing_written(client: tuple) -> None:  # type: ignore[type-arg]
    api, admin, viewer, factory = client
    async with factory() as s:  # type: ignore[operator]
        on_a = sorted(f"vision/{n}" for n, where in (await s.execute(
            select(Claim.name, Claim.node).where(Claim.state == "Allocated"))).all() if where == "a")
        before = await s.scalar(select(func.count()).select_from(AuditEntry))
    drained = await api.post("/v1/whatif", json={"drain": ["a"]}, headers=admin)
    assert drained.status_code == 200, drained.text
    assert [p["claim"] for p in drained.json()["preempted"]] == on_a and len(on_a) == 2
    assert drained.json()["pending"]["vision"] == {"before": 1, "after": 3}
    cut = await api.post("/v1/whatif", headers=admin, json={"quotas": {"kind": "Quotas", "tenants": [
        {"name": "vision", "quotas": {"H100": {"nominal": 1, "borrowingLimit": 1}}}]}})
    assert len(cut.json()["overQuota"]["claims"]) == 2
    assert (await api.post("/v1/whatif", json={}, headers=viewer)).status_code == 403
    wrong = await api.post("/v1/whatif", json={"drain": ["zz"]}, headers=admin)
    assert wrong.status_code == 422 and "no node zz" in wrong.json()["detail"]
    bad = await api.post("/v1/whatif", json={"quotas": {"kind": "Quotas", "tenants": [{"weight": 1}]}}, headers=admin)
    assert bad.status_code == 422 and "quotas" in bad.json()["detail"]
    selector = await api.post("/v1/whatif", headers=admin, json={"quotas": {"kind": "Quotas", "flavors": [
        {"name": "x", "selector": "((("}]}})
    assert selector.status_code == 422 and "quotas.flavors[0].selector" in selector.json()["detail"]
    async with factory() as s:  # type: ignore[operator]
        assert await s.scalar(select(func.count()).select_from(AuditEntry)) == before


@pytest.mark.parametrize(("document", "said"), [
    pytest.param({"kind": "Topology", "nodes": [{"namePrefix": "n-", "count": 20_000, "gpuModel": "H100",
                                                 "gpuCount": 1}]},
                 "20,000 nodes proposed, over the limit of 5,000 (CLAIMBROKER_WHATIF_MAX_NODES)", id="nodes"),
    pytest.param({"kind": "Topology", "nodes": [{"namePrefix": "n-", "count": 100, "gpuModel": "H100",
                                                 "gpuCount": 1000}]},
                 "100,000 devices proposed, over the limit of 40,000 (CLAIMBROKER_WHATIF_MAX_DEVICES)", id="devices"),
])
async def test_a_proposal_past_the_limits_is_refused_before_it_is_built(
        client: tuple, document: dict, said: str) -> None:  # type: ignore[type-arg]
    """A Topology of a few bytes may name any number of nodes: counted, not built (the 20,000-node what-if
    of issue 35 took 27.8 s on the allocator's loop)."""
    api, admin, _, _ = client
    refused = await api.post("/v1/whatif", json={"addInventory": [document]}, headers=admin)
    assert refused.status_code == 422 and refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["title"] == "proposal too large" and said in refused.json()["detail"], refused.text
    added = await api.post("/v1/whatif", headers=admin, json={"addInventory": [
        {"kind": "Topology", "nodes": [{"namePrefix": "n-", "count": 2, "gpuModel": "H100", "gpuCount": 8}]}]})
    assert added.status_code == 200 and added.json()["pending"]["vision"] == {"before": 1, "after": 0}
