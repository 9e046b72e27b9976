"""The admin API against a freshly migrated ledger, once on SQLite and once on PostgreSQL.

The database fixture is `db_url` from tests/conftest.py: a SQLite file under tmp_path, or a database
`cb_test_<random>` of its own on the local PostgreSQL, dropped at teardown.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from services.admin_api.app import create_app
from shared.ledger.engine import create_engine
from shared.ledger.quota_store import load_quota_config
from shared.ledger.schema import ApiToken, Claim, Cohort, Quota
from shared.ledger.tokens import create_token, generate_token, hash_token
from tests.integration.admin import Api, assert_problem


async def add_claims(api: Api) -> None:
    """Claims are written by the allocator, never through this API, so tests put them in the ledger."""
    async with api.factory() as s, s.begin():
        s.add_all([
            Claim(namespace="vision", name="train", state="Allocated", spec={}, priority=5, preemptible=False,
                  allocation={"devices": [{"device": "gpu-0"}]}, sequence=1),
            Claim(namespace="vision", name="eval", state="Pending", spec={}, reason="quota exhausted",
                  sequence=1),
            Claim(namespace="speech", name="asr", state="Pending", spec={}, reason="no capacity", sequence=1),
        ])


# --- auth ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer cb_not-a-token"}, {"Authorization": "Basic YWRtaW46YWRtaW4="},
     {"Authorization": "Bearer"}],
    ids=["none", "wrong", "not-bearer", "empty"],
)
@pytest.mark.parametrize("method, path", [("GET", "/v1/tenants"), ("GET", "/v1/claims"),
                                          ("PUT", "/v1/tenants/vision")])
async def test_no_or_wrong_token_is_401(api: Api, headers: dict[str, str], method: str, path: str) -> None:
    response = await api.client.request(method, path, headers=headers, json={})
    assert_problem(response, 401)
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("method, path, body", [
    ("PUT", "/v1/tenants/vision", {"weight": 2}),
    ("DELETE", "/v1/tenants/vision", None),
    ("PUT", "/v1/tenants/vision/quotas/H100", {"nominal": 1}),
    ("DELETE", "/v1/tenants/vision/quotas/H100", None),
])
async def test_viewer_writing_is_403(api: Api, method: str, path: str, body: dict[str, Any] | None) -> None:
    await api.client.put("/v1/tenants/vision", json={}, headers=api.admin)
    await api.client.put("/v1/tenants/vision/quotas/H100", json={"nominal": 1}, headers=api.admin)
    before = len(await api.audit())
    for headers in (api.viewer, api.scoped):
        assert_problem(await api.client.request(method, path, json=body, headers=headers), 403)
    assert len(await api.audit()) == before, "a refused write leaves no trace in the audit log"
    assert (await api.client.get("/v1/tenants/vision/quotas", headers=api.viewer)).json()[0]["nominal"] == 1


async def test_tokens_are_stored_hashed_and_only_viewers_are_scoped(api: Api) -> None:
    token = generate_token()
    assert token.startswith("cb_") and len(token) > 40
    assert hash_token(token) == hash_token(token) != token
    async with api.factory() as s:
        hashes = set(await s.scalars(select(ApiToken.token_hash)))
    plaintext = api.admin["Authorization"].removeprefix("Bearer ")
    assert plaintext not in hashes and hash_token(plaintext) in hashes
    with pytest.raises(ValueError, match="role"):
        await create_token(api.factory, "root", None)
    with pytest.raises(ValueError, match="viewer"):
        await create_token(api.factory, "admin", "vision")


# --- tenants, cohorts, quotas ---------------------------------------------------------------------------


async def test_tenant_crud_creates_cohorts_and_audits(api: Api) -> None:
    created = await api.client.put("/v1/tenants/vision", headers=api.admin,
                                   json={"cohort": "research", "weight": 2, "pendingAlertAfter": 600})
    assert created.status_code == 200
    assert created.json() == {
        "name": "vision", "cohort": "research", "weight": 2.0, "pendingAlertAfter": 600.0,
        "adminAccess": False, "maxPending": None,
        "minRuntime": None, "maxPreemptionsPerMinute": None, "gangReserveAfter": None}
    async with api.factory() as s:
        assert await s.get(Cohort, "research") is not None, "naming a cohort creates it"

    await api.client.put("/v1/tenants/speech", json={}, headers=api.admin)
    listed = await api.client.get("/v1/tenants", headers=api.viewer)
    assert [(t["name"], t["cohort"], t["weight"]) for t in listed.json()] == [
        ("speech", None, 1.0), ("vision", "research", 2.0)]

    updated = await api.client.put("/v1/tenants/vision", json={"cohort": "research", "weight": 3},
                                   headers=api.admin)
    assert updated.json()["weight"] == 3.0 and updated.json()["pendingAlertAfter"] is None, "PUT replaces"
    assert (await api.client.get("/v1/tenants/vision", headers=api.viewer)).json() == updated.json()
    marked = await api.client.put("/v1/tenants/speech", json={"adminAccess": True, "maxPending": 50,
                                                              "minRuntime": 300, "maxPreemptionsPerMinute": 4,
                                                              "gangReserveAfter": 600},
                                  headers=api.admin)
    assert (marked.json()["adminAccess"], marked.json()["maxPending"]) == (True, 50)
    assert (marked.json()["minRuntime"], marked.json()["maxPreemptionsPerMinute"]) == (300.0, 4)
    assert marked.json()["gangReserveAfter"] == 600.0
    async with api.factory() as s:
        config = await load_quota_config(s)
        speech = config.tenant("speech")
        assert speech.admin_access and speech.max_pending == 50, "the allocator reads them"
        assert (speech.min_runtime, speech.max_preemptions_per_minute) == (300.0, 4)
        assert (config.gang_reserve_after("speech"), config.gang_reserve_after("vision")) == (600.0, 300.0), (
            "its own gangReserveAfter; the broker's default (5m) for a tenant without one")
    off = await api.client.put("/v1/tenants/speech", json={"gangReserveAfter": 0}, headers=api.admin)
    assert off.status_code == 200 and off.json()["gangReserveAfter"] == 0.0, "0: off, not the default"
    async with api.factory() as s:
        assert (await load_quota_config(s)).gang_reserve_after("speech") == 0.0

    assert (await api.client.delete("/v1/tenants/vision", headers=api.admin)).status_code == 204
    assert_problem(await api.client.get("/v1/tenants/vision", headers=api.admin), 404)
    assert_problem(await api.client.delete("/v1/tenants/vision", headers=api.admin), 404)

    entries = await api.audit()
    assert [(e.actor, e.action, e.entity) for e in entries] == [
        (f"token:{api.admin_id}", "put", "tenant/vision"),
        (f"token:{api.admin_id}", "put", "tenant/speech"),
        (f"token:{api.admin_id}", "put", "tenant/vision"),
        (f"token:{api.admin_id}", "put", "tenant/speech"),
        (f"token:{api.admin_id}", "put", "tenant/speech"),
        (f"token:{api.admin_id}", "delete", "tenant/vision"),
    ]
    assert entries[0].before is None and entries[0].after == created.json()
    assert entries[2].before == created.json() and entries[2].after == updated.json()
    assert entries[3].after == marked.json()
    assert entries[4].before == marked.json() and entries[4].after == off.json()
    assert entries[5].before == updated.json() and entries[5].after is None


async def test_quota_crud_and_audit(api: Api) -> None:
    assert_problem(await api.client.put("/v1/tenants/ghost/quotas/H100", json={"nominal": 1},
                                        headers=api.admin), 404)
    await api.client.put("/v1/tenants/vision", json={}, headers=api.admin)
    put = await api.client.put("/v1/tenants/vision/quotas/H100", json={"nominal": 8, "borrowingLimit": 4},
                               headers=api.admin)
    assert put.status_code == 200
    assert put.json() == {"tenant": "vision", "flavor": "H100", "nominal": 8, "borrowingLimit": 4,
                          "lendingLimit": None}
    changed = await api.client.put("/v1/tenants/vision/quotas/H100", headers=api.admin,
                                   json={"nominal": 6, "borrowing_limit": 0, "lendingLimit": 2})
    assert changed.json() == {"tenant": "vision", "flavor": "H100", "nominal": 6, "borrowingLimit": 0,
                              "lendingLimit": 2}, "snake_case input is accepted too"
    await api.client.put("/v1/tenants/vision/quotas/A100", json={"nominal": 2}, headers=api.admin)
    listed = await api.client.get("/v1/tenants/vision/quotas", headers=api.viewer)
    assert [(q["flavor"], q["nominal"]) for q in listed.json()] == [("A100", 2), ("H100", 6)]

    assert (await api.client.delete("/v1/tenants/vision/quotas/A100", headers=api.admin)).status_code == 204
    assert_problem(await api.client.delete("/v1/tenants/vision/quotas/A100", headers=api.admin), 404)
    assert_problem(await api.client.get("/v1/tenants/ghost/quotas", headers=api.admin), 404)

    # Deleting the tenant takes its remaining quota with it, and says so in the audit log.
    assert (await api.client.delete("/v1/tenants/vision", headers=api.admin)).status_code == 204
    async with api.factory() as s:
        assert list(await s.scalars(select(Quota))) == []
    entries = await api.audit()
    assert [(e.action, e.entity) for e in entries] == [
        ("put", "tenant/vision"), ("put", "quota/vision/H100"), ("put", "quota/vision/H100"),
        ("put", "quota/vision/A100"), ("delete", "quota/vision/A100"),
        ("delete", "quota/vision/H100"), ("delete", "tenant/vision")]
    assert entries[2].before == put.json() and entries[2].after == changed.json()
    assert entries[5].before == changed.json() and entries[5].after is None


@pytest.mark.parametrize("path, body, field", [
    ("/v1/tenants/vision", {"weight": -1}, "weight"),
    ("/v1/tenants/vision", {"weight": "heavy"}, "weight"),
    ("/v1/tenants/vision", {"pendingAlertAfter": 0}, "pendingAlertAfter"),
    ("/v1/tenants/vision", {"gangReserveAfter": -1}, "gangReserveAfter"),
    ("/v1/tenants/vision", {"gangReserveAfter": "5m"}, "gangReserveAfter"),
    ("/v1/tenants/vision", {"cohort": ""}, "cohort"),
    ("/v1/tenants/vision", {"wieght": 2}, "wieght"),
    ("/v1/tenants/vision/quotas/H100", {"nominal": -1}, "nominal"),
    ("/v1/tenants/vision/quotas/H100", {"nominal": 1.5}, "nominal"),
    ("/v1/tenants/vision/quotas/H100", {"borrowingLimit": -2}, "borrowingLimit"),
    ("/v1/tenants/vision/quotas/H100", {"lendingLimit": -3}, "lendingLimit"),
])
async def test_invalid_bodies_are_422_problems(api: Api, path: str, body: dict[str, Any], field: str) -> None:
    await api.client.put("/v1/tenants/vision", json={}, headers=api.admin)
    before = len(await api.audit())
    problem = assert_problem(await api.client.put(path, json=body, headers=api.admin), 422)
    assert field in problem["detail"]
    assert len(await api.audit()) == before


async def test_malformed_json_is_a_422_problem(api: Api) -> None:
    response = await api.client.put("/v1/tenants/vision", content=b"{not json",
                                     headers={**api.admin, "Content-Type": "application/json"})
    assert_problem(response, 422)


async def test_not_found_and_wrong_method_are_problems(api: Api) -> None:
    assert_problem(await api.client.get("/v1/nothing-here", headers=api.admin), 404)
    assert_problem(await api.client.get("/v1/tenants/ghost", headers=api.admin), 404)
    assert_problem(await api.client.get("/v1/claims/vision/ghost", headers=api.admin), 404)
    wrong = await api.client.post("/v1/tenants/vision", headers=api.admin)
    assert_problem(wrong, 405)
    assert "allow" in wrong.headers  # Starlette names only the first matching route's methods here


# --- claims -------------------------------------------------------------------------------------------


async def test_claims_read_and_filter(api: Api) -> None:
    await add_claims(api)
    everything = await api.client.get("/v1/claims", headers=api.viewer)
    assert [(c["namespace"], c["name"]) for c in everything.json()["items"]] == [
        ("vision", "train"), ("vision", "eval"), ("speech", "asr")]
    pending = await api.client.get("/v1/claims", params={"state": "Pending"}, headers=api.viewer)
    assert [c["name"] for c in pending.json()["items"]] == ["eval", "asr"]
    both = await api.client.get("/v1/claims", params={"state": "Pending", "namespace": "vision"},
                                headers=api.viewer)
    assert [c["name"] for c in both.json()["items"]] == ["eval"]

    one = (await api.client.get("/v1/claims/vision/train", headers=api.viewer)).json()
    assert set(one) == {"namespace", "name", "state", "reason", "allocation", "node", "priority", "preemptible",
                        "submittedAt", "updatedAt", "estimatedStart", "estimatedStartReason", "history"}
    assert one["state"] == "Allocated" and one["reason"] is None and one["priority"] == 5
    assert one["preemptible"] is False and one["allocation"] == {"devices": [{"device": "gpu-0"}]}
    for stamp in (one["submittedAt"], one["updatedAt"]):
        assert datetime.fromisoformat(stamp).utcoffset() is not None, "timestamps carry their zone"


async def test_scoped_viewer_sees_only_its_tenant(api: Api) -> None:
    await add_claims(api)
    for name in ("vision", "speech"):
        await api.client.put(f"/v1/tenants/{name}", json={}, headers=api.admin)
        await api.client.put(f"/v1/tenants/{name}/quotas/H100", json={"nominal": 1}, headers=api.admin)

    claims = await api.client.get("/v1/claims", headers=api.scoped)
    assert {c["namespace"] for c in claims.json()["items"]} == {"vision"} and len(claims.json()["items"]) == 2
    other = await api.client.get("/v1/claims", params={"namespace": "speech"}, headers=api.scoped)
    assert other.json() == {"items": [], "next": None}
    assert (await api.client.get("/v1/claims/vision/eval", headers=api.scoped)).json()["reason"] == (
        "quota exhausted")
    assert_problem(await api.client.get("/v1/claims/speech/asr", headers=api.scoped), 404)

    assert [t["name"] for t in (await api.client.get("/v1/tenants", headers=api.scoped)).json()] == ["vision"]
    assert (await api.client.get("/v1/tenants/vision", headers=api.scoped)).status_code == 200
    assert_problem(await api.client.get("/v1/tenants/speech", headers=api.scoped), 404)
    assert (await api.client.get("/v1/tenants/vision/quotas", headers=api.scoped)).status_code == 200
    assert_problem(await api.client.get("/v1/tenants/speech/quotas", headers=api.scoped), 404)


# --- operations ---------------------------------------------------------------------------------------


async def test_health_and_readiness(api: Api) -> None:
    health = await api.client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert (await api.client.get("/readyz")).status_code == 200


async def test_not_ready_without_a_ledger() -> None:
    engine = create_engine("postgresql://postgres@127.0.0.1:1/nowhere")  # nothing listens on port 1
    transport = httpx.ASGITransport(app=create_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        assert (await client.get("/healthz")).status_code == 200, "liveness does not depend on the ledger"
        assert_problem(await client.get("/readyz"), 503)
    await engine.dispose()


async def test_openapi_lists_the_routes_and_bearer_auth(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    paths = document["paths"]
    assert {"/healthz", "/readyz", "/v1/tenants", "/v1/tenants/{name}", "/v1/tenants/{name}/quotas",
            "/v1/tenants/{name}/quotas/{flavor}", "/v1/claims", "/v1/claims/{namespace}/{name}"} <= set(paths)
    assert set(paths["/v1/tenants/{name}"]) == {"get", "put", "delete"}
    assert set(paths["/v1/tenants/{name}/quotas/{flavor}"]) == {"put", "delete"}
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    tenant = document["components"]["schemas"]["TenantOut"]["properties"]
    assert "pendingAlertAfter" in tenant, "the document shows the camelCase names clients use"


async def test_asyncapi_is_served_next_to_openapi_and_is_the_cli_s(api: Api) -> None:
    import json
    import subprocess
    import sys

    from services.bus.asyncapi import document

    response = await api.client.get("/asyncapi.json")  # a description of the bus, public like /openapi.json
    assert response.status_code == 200 and response.json() == document()
    printed = subprocess.run([sys.executable, "-m", "services.cli", "asyncapi"], capture_output=True, text=True,
                             check=True, timeout=60)
    assert json.loads(printed.stdout) == document() and response.json()["asyncapi"] == "3.0.0"
