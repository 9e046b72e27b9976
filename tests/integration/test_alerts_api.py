"""GET /v1/alerts against a migrated ledger, on SQLite and PostgreSQL: auth, tenant scope, filters, shape."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.alerts.book import Alert, Message
from shared.ledger import alerts as alert_history
from tests.integration.admin import Api

T0 = 1_800_000_000.0




def message(kind: str, key: str, labels: dict[str, str], at: float, *, resolved: bool = False) -> Message:
    return Message(Alert(kind, "warning", key, f"{kind} summary", {"why": 1}, labels), at, at + 5, 2, resolved)




async def test_alerts_need_a_token(api: Api) -> None:
    response = await api.client.get("/v1/alerts")
    assert response.status_code == 401 and response.headers["content-type"] == "application/problem+json"


async def test_alerts_newest_first_in_the_contract_shape(api: Api) -> None:
    response = await api.client.get("/v1/alerts", headers=api.viewer)
    assert response.status_code == 200
    body = response.json()
    assert [a["key"] for a in body] == ["node-lost:n1", "claim-rejected:speech/b", "claim-rejected:vision/a"]
    assert body[0] == {
        "key": "node-lost:n1", "kind": "node-lost", "severity": "warning", "tenant": None,
        "summary": "node-lost summary", "details": {"why": 1}, "labels": {"node": "n1"},
        "firstSeen": "2027-01-15T08:00:20Z", "lastSeen": "2027-01-15T08:00:25Z", "count": 2,
        "resolved": True, "resolvedAt": "2027-01-15T08:00:25Z"}


async def test_a_scoped_viewer_sees_only_its_tenant(api: Api) -> None:
    body = (await api.client.get("/v1/alerts", headers=api.scoped)).json()
    assert [a["key"] for a in body] == ["claim-rejected:vision/a"]


@pytest.mark.parametrize(("query", "keys"), [
    ("kind=node-lost", ["node-lost:n1"]),
    ("resolved=false", ["claim-rejected:speech/b", "claim-rejected:vision/a"]),
    ("resolved=true", ["node-lost:n1"]),
    ("limit=1", ["node-lost:n1"]),
    ("kind=claim-rejected&resolved=false&limit=1", ["claim-rejected:speech/b"]),
])
async def test_filters(api: Api, query: str, keys: list[str]) -> None:
    body = (await api.client.get(f"/v1/alerts?{query}", headers=api.admin)).json()
    assert [a["key"] for a in body] == keys


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "resolved=maybe"])
async def test_bad_filters_are_problems(api: Api, query: str) -> None:
    response = await api.client.get(f"/v1/alerts?{query}", headers=api.admin)
    assert response.status_code == 422 and response.headers["content-type"] == "application/problem+json"


@pytest.fixture
async def api(api: Api) -> AsyncIterator[Api]:
    """The shared admin API with alerts of two tenants and a node, written the way the notifier writes them."""
    async with api.factory() as s, s.begin():
        await alert_history.record(s, [
            message("claim-rejected", "claim-rejected:vision/a", {"tenant": "vision", "claim": "a"}, T0),
            message("claim-rejected", "claim-rejected:speech/b", {"tenant": "speech", "claim": "b"}, T0 + 10),
            message("node-lost", "node-lost:n1", {"node": "n1"}, T0 + 20, resolved=True),
        ])
    yield api
