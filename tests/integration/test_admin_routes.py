"""The admin API against a migrated ledger, on SQLite and PostgreSQL: auth, roles, CRUD, problems, audit."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select

from shared.ledger.schema import AuditEntry, Claim
from tests.integration.admin import Api


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}],
                         ids=["none", "wrong", "not-bearer"])
async def test_reads_need_a_valid_token(api: Api, headers: dict[str, str]) -> None:
    response = await api.client.get("/v1/tenants", headers=headers)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"] == "Bearer"


async def test_viewer_cannot_write(api: Api) -> None:
    response = await api.client.put("/v1/tenants/vision", json={"weight": 2}, headers=api.viewer)
    assert response.status_code == 403
    assert response.json()["title"] == "this token may only read"


async def test_tenant_and_quota_lifecycle_is_audited(api: Api) -> None:
    put = await api.client.put("/v1/tenants/vision", json={"cohort": "research", "weight": 2},
                               headers=api.admin)
    assert put.status_code == 200 and put.json() == {
        "name": "vision", "cohort": "research", "weight": 2.0, "pendingAlertAfter": None,
        "adminAccess": False, "maxPending": None,
        "minRuntime": None, "maxPreemptionsPerMinute": None, "gangReserveAfter": None}
    quota = await api.client.put("/v1/tenants/vision/quotas/H100",
                                 json={"nominal": 8, "borrowingLimit": 4}, headers=api.admin)
    assert quota.json() == {"tenant": "vision", "flavor": "H100", "nominal": 8, "borrowingLimit": 4,
                            "lendingLimit": None}
    listed = await api.client.get("/v1/tenants/vision/quotas", headers=api.viewer)
    assert [q["nominal"] for q in listed.json()] == [8]
    assert (await api.client.delete("/v1/tenants/vision/quotas/H100", headers=api.admin)).status_code == 204
    assert (await api.client.delete("/v1/tenants/vision", headers=api.admin)).status_code == 204
    assert (await api.client.get("/v1/tenants/vision", headers=api.admin)).status_code == 404
    async with api.factory() as s:
        entries = list(await s.scalars(select(AuditEntry).where(AuditEntry.entity.not_like("token/%"))
                                       .order_by(AuditEntry.id)))
    assert [(e.action, e.entity) for e in entries] == [
        ("put", "tenant/vision"), ("put", "quota/vision/H100"), ("delete", "quota/vision/H100"),
        ("delete", "tenant/vision")]
    assert entries[1].after == {"tenant": "vision", "flavor": "H100", "nominal": 8, "borrowingLimit": 4,
                                "lendingLimit": None}
    assert entries[0].before is None and entries[3].after is None


async def test_validation_errors_are_problems(api: Api) -> None:
    response = await api.client.put("/v1/tenants/vision", json={"weight": -1}, headers=api.admin)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert "weight" in response.json()["detail"]


async def test_claims_are_scoped_to_the_viewers_tenant(api: Api) -> None:
    everyone = await api.client.get("/v1/claims", headers=api.viewer)
    assert [(c["namespace"], c["name"]) for c in everyone.json()["items"]] == [("vision", "a"), ("speech", "b")]
    scoped = await api.client.get("/v1/claims", headers=api.scoped)
    assert [(c["namespace"], c["name"]) for c in scoped.json()["items"]] == [("vision", "a")]
    assert (await api.client.get("/v1/claims/speech/b", headers=api.scoped)).status_code == 404
    one = await api.client.get("/v1/claims/vision/a", headers=api.scoped)
    assert one.json()["state"] == "Pending" and one.json()["reason"] == "waits"


async def test_health_readiness_and_openapi(api: Api) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    assert (await api.client.get("/readyz")).status_code == 200
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    assert {"/v1/tenants", "/v1/tenants/{name}/quotas/{flavor}", "/v1/claims/{namespace}/{name}"} <= set(paths)


@pytest.fixture
async def api(api: Api) -> AsyncIterator[Api]:
    """The shared admin API with a waiting claim of each of two tenants."""
    async with api.factory() as s, s.begin():
        s.add_all([Claim(namespace=ns, name=n, state="Pending", spec={}, reason="waits", sequence=1)
                   for ns, n in (("vision", "a"), ("speech", "b"))])
    yield api
