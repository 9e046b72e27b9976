"""The admin API refuses, with a 422 problem naming the field, what could never be used or stored: tenant and
cohort names that are not DNS labels (a tenant is a namespace), NUL characters in any parameter or body,
numbers over the ledger's 32-bit columns, floats that are not finite. Once on SQLite, once on PostgreSQL
(which is the one that refused NUL with a 500 before).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest

from shared.ledger.schema import Tenant
from tests.integration.admin import PROBLEM, Api

LABEL_RULE = "must be a DNS label"






def assert_422(response: httpx.Response, field: str, words: str = "") -> str:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert set(body) == {"type", "title", "status", "detail"} and body["status"] == 422
    detail: str = body["detail"]
    assert detail.startswith(f"{field}: ") or f"; {field}: " in detail, detail
    assert words in detail, detail
    return detail


BAD_NAMES = [("dot", "bad.name"), ("script", "<script>"), ("upper", "Vision"), ("underscore", "under_score"),
             ("leading-hyphen", "-vision"), ("trailing-hyphen", "vision-"), ("64", "t" * 64), ("space", "a b")]


@pytest.mark.parametrize("name", [pytest.param(n, id=i) for i, n in BAD_NAMES])
@pytest.mark.parametrize("route", ["tenants", "cohorts"])
async def test_a_name_that_is_not_a_dns_label_is_refused(api: Api, route: str, name: str) -> None:
    before = await api.rows()
    response = await api.client.put(f"/v1/{route}/{quote(name, safe='')}", json={}, headers=api.admin)
    assert_422(response, "path.name", LABEL_RULE)
    assert await api.rows() == before, "nothing written, nothing audited"


async def test_a_cohort_named_in_a_tenant_body_is_a_dns_label(api: Api) -> None:
    before = await api.rows()
    response = await api.client.put("/v1/tenants/vision", json={"cohort": "Research.Team"}, headers=api.admin)
    assert_422(response, "body.cohort", LABEL_RULE)
    assert await api.rows() == before


# (id, method, path, body, the field the 422 names)
REFUSED: list[tuple[str, str, str, Any, str]] = [
    # a NUL in any parameter, declared by the route or not
    ("claims-undeclared-tenant", "GET", "/v1/claims?tenant=%00", None, "query.tenant"),
    ("claims-namespace", "GET", "/v1/claims?namespace=%00", None, "query.namespace"),
    ("claims-state", "GET", "/v1/claims?state=Pending%00", None, "query.state"),
    ("claims-node", "GET", "/v1/claims?node=%00n", None, "query.node"),
    ("alerts-kind", "GET", "/v1/alerts?kind=%00", None, "query.kind"),
    ("audit-entity", "GET", "/v1/audit?entity=tenant/%00", None, "query.entity"),
    ("query-key", "GET", "/v1/tenants?a%00b=1", None, "query.a\\u0000b"),
    ("tenant-path", "GET", "/v1/tenants/%00", None, "path.name"),
    ("tenant-quotas-path", "GET", "/v1/tenants/vi%00sion/quotas", None, "path.name"),
    ("claim-path", "GET", "/v1/claims/vision/a%00b", None, "path.name"),
    ("claim-explain-path", "GET", "/v1/claims/vi%00sion/a/explain", None, "path.namespace"),
    ("delete-tenant-path", "DELETE", "/v1/tenants/%00", None, "path.name"),
    ("delete-flavor-path", "DELETE", "/v1/flavors/H%00100", None, "path.name"),
    ("put-flavor-path", "PUT", "/v1/flavors/H%00100", {"selector": "true"}, "path.name"),
    # a NUL or a lone surrogate in a body's text
    ("flavor-selector-nul", "PUT", "/v1/flavors/custom", {"selector": "true\u0000"}, "body.selector"),
    ("flavor-selector-surrogate", "PUT", "/v1/flavors/custom", b'{"selector": "true || \\ud800"}', "body.selector"),
    # numbers the ledger's columns cannot hold
    ("quota-nominal-int32", "PUT", "/v1/tenants/vision/quotas/H100", {"nominal": 2**31}, "body.nominal"),
    ("quota-borrowing-int32", "PUT", "/v1/tenants/vision/quotas/H100", {"borrowingLimit": 2**31},
     "body.borrowingLimit"),
    ("quota-lending-int32", "PUT", "/v1/tenants/vision/quotas/H100", {"lendingLimit": 2**40}, "body.lendingLimit"),
    ("flavor-position-int32", "PUT", "/v1/flavors/custom", {"selector": "true", "position": 2**31},
     "body.position"),
    ("tenant-weight-infinity", "PUT", "/v1/tenants/vision", b'{"weight": Infinity}', "body.weight"),
    ("tenant-pending-nan", "PUT", "/v1/tenants/vision", b'{"pendingAlertAfter": NaN}', "body.pendingAlertAfter"),
    ("tenant-gang-reserve-inf", "PUT", "/v1/tenants/vision", b'{"gangReserveAfter": Infinity}',
     "body.gangReserveAfter"),
    ("flavor-value-infinity", "PUT", "/v1/flavors/custom", b'{"selector": "true", "value": Infinity}',
     "body.value"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), [pytest.param(*r[1:], id=r[0]) for r in REFUSED])
async def test_refused_with_a_problem_naming_the_field(api: Api, method: str, path: str, body: Any,
                                                       field: str) -> None:
    await api.client.put("/v1/tenants/vision", json={}, headers=api.admin)
    before = await api.rows()
    if isinstance(body, bytes):
        response = await api.client.request(method, path, content=body,
                                            headers={**api.admin, "Content-Type": "application/json"})
    else:
        response = await api.client.request(method, path, json=body, headers=api.admin)
    assert_422(response, field)
    assert await api.rows() == before


# (id, a Quotas document, the field the 422 names)
IMPORTS: list[tuple[str, str, str]] = [
    ("tenant-name-dot", "tenants:\n- name: bad.name\n", "Quotas: tenants[0].name"),
    ("tenant-name-script", "tenants:\n- name: ok\n- name: '<script>'\n", "Quotas: tenants[1].name"),
    ("tenant-name-64", f"tenants:\n- name: {'t' * 64}\n", "Quotas: tenants[0].name"),
    ("tenant-cohort", "tenants:\n- name: vision\n  cohort: Research\n", "Quotas: tenants[0].cohort"),
    ("cohort-name", "cohorts:\n- name: research_team\n", "Quotas: cohorts[0].name"),
    ("tenant-name-nul", 'tenants:\n- name: "vi\\0sion"\n', "Quotas: tenants[0].name"),
    ("nominal-int32", "tenants:\n- name: vision\n  quotas: {H100: {nominal: 2147483648}}\n",
     "Quotas: tenants[0].quotas.H100.nominal"),
    ("borrowing-int32", "tenants:\n- name: vision\n  quotas: {H100: {nominal: 1, borrowingLimit: 99999999999}}\n",
     "Quotas: tenants[0].quotas.H100.borrowingLimit"),
    ("weight-infinite", "tenants:\n- name: vision\n  weight: .inf\n", "Quotas: tenants[0].weight"),
    ("gang-reserve-infinite", "tenants:\n- name: vision\n  gangReserveAfter: .inf\n",
     "Quotas: tenants[0].gangReserveAfter"),
    ("flavor-value-infinite", "flavors:\n- {name: big, selector: 'true', value: .inf}\n", "Quotas: flavors[0].value"),
    ("flavor-name-254", f"flavors:\n- {{name: {'f' * 254}, selector: 'true'}}\n", "Quotas: flavors[0].name"),
]


@pytest.mark.parametrize(("document", "field"), [pytest.param(*r[1:], id=r[0]) for r in IMPORTS])
async def test_an_import_the_ledger_cannot_hold_is_refused(api: Api, document: str, field: str) -> None:
    before = await api.rows()
    response = await api.client.post("/v1/quotas/import", content=f"kind: Quotas\n{document}".encode(),
                                     headers={**api.admin, "Content-Type": "application/yaml"})
    assert_422(response, field)
    assert await api.rows() == before


async def test_valid_names_and_limits_are_accepted(api: Api) -> None:
    longest = "t" * 63
    for name in ("vision", "team-2", "7", longest):
        response = await api.client.put(f"/v1/tenants/{name}", json={"cohort": "research"}, headers=api.admin)
        assert response.status_code == 200, response.text
    assert (await api.client.put("/v1/cohorts/shared-pool", headers=api.admin)).status_code == 200
    quota = await api.client.put("/v1/tenants/vision/quotas/H100",
                                 json={"nominal": 2**31 - 1, "borrowingLimit": 0}, headers=api.admin)
    assert quota.status_code == 200, quota.text
    imported = await api.client.post(
        "/v1/quotas/import", headers={**api.admin, "Content-Type": "application/yaml"},
        content=b"kind: Quotas\ncohorts: [{name: research}]\ntenants:\n- {name: vision, cohort: research, "
                b"quotas: {H100: {nominal: 2147483647}}}\n")
    assert imported.status_code == 200, imported.text
    listed = await api.client.get("/v1/claims?namespace=vision&state=Pending", headers=api.admin)
    assert listed.status_code == 200 and listed.json()["items"] == []


async def test_a_row_written_before_the_rule_can_still_be_read_and_deleted(api: Api) -> None:
    """Reads and deletes take any name: the rule is for new rows, and an old one must not get stuck."""
    async with api.factory() as s, s.begin():
        s.add(Tenant(name="Legacy_Team", weight=1.0))
    assert (await api.client.get("/v1/tenants/Legacy_Team", headers=api.admin)).status_code == 200
    assert (await api.client.delete("/v1/tenants/Legacy_Team", headers=api.admin)).status_code == 204
    assert (await api.client.get("/v1/tenants/Legacy_Team", headers=api.admin)).status_code == 404


async def test_the_openapi_document_states_the_name_rule(api: Api) -> None:
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    for path in ("/v1/tenants/{name}", "/v1/cohorts/{name}"):
        (name,) = [p for p in paths[path]["put"]["parameters"] if p["name"] == "name"]
        assert name["schema"]["maxLength"] == 63 and name["schema"]["pattern"].startswith("^[a-z0-9]")
