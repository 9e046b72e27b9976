"""Cohorts, flavors, quota rules, import/export with dry run, usage, claims paging/history/explain and the
audit log, on SQLite and PostgreSQL; and a schemathesis run against /openapi.json.

Claims and device allocations are the allocator's to write, so tests put them in the ledger directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, settings

from services.admin_api.app import create_app
from services.admin_api.quotas import requested_devices
from shared.admission.quota import BUILTIN_FLAVORS, parse_quotas
from shared.dra.inventory import Fleet
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.quota_store import apply_quota_config, load_quota_config
from shared.ledger.schema import Claim, ClaimEvent, DeviceAllocation
from shared.ledger.tokens import create_token
from tests.integration.admin import PROBLEM, Api, assert_problem, bearer

QUOTAS = """\
kind: Quotas
flavors:
  - name: H100
    selector: device.attributes["gpu.nvidia.com"].productName.contains("H100")
    value: 2.0
  - name: big-memory
    selector: device.driver == "gpu.nvidia.com"
    value: 1.5
cohorts:
  - name: research
tenants:
  - name: speech
    cohort: research
    weight: 1.0
    gangReserveAfter: 0s
    quotas:
      H100: {nominal: 2, borrowingLimit: 0}
  - name: vision
    cohort: research
    weight: 2.0
    pendingAlertAfter: 5m
    gangReserveAfter: 10m
    quotas:
      H100: {nominal: 8, borrowingLimit: 4, lendingLimit: 2}
      A100-1g.10gb: {nominal: 14}
"""










def gpu_claim(count: int = 1, mode: str = "ExactCount") -> dict[str, Any]:
    """As the allocator stores it: the whole ResourceClaim document."""
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "allocationMode": mode}
    if mode == "ExactCount":
        exactly["count"] = count
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


async def add_claim(api: Api, namespace: str, name: str, *, flavor: str | None = None, devices: int = 0,
                    units: float = 2.0, state: str | None = None, node: str = "node-01",
                    spec: dict[str, Any] | None = None, reason: str | None = None,
                    explain: dict[str, Any] | None = None) -> int:
    """An Allocated claim holding `devices` devices of `flavor`, or a Pending one when devices == 0."""
    state = state or ("Allocated" if devices else "Pending")
    async with api.factory() as s, s.begin():
        claim = Claim(namespace=namespace, name=name, state=state, spec=spec or gpu_claim(max(devices, 1)),
                      reason=reason, sequence=1, node=node if devices else None, explain=explain)
        s.add(claim)
        await s.flush()
        s.add_all([DeviceAllocation(driver="gpu.nvidia.com", pool=node, device=f"{namespace}-{name}-{i}",
                                    claim_id=claim.id, node=node, request="gpu", flavor=flavor, units=units)
                   for i in range(devices)])
        return claim.id


async def import_(api: Api, document: str, *, dry_run: bool = False,
                  headers: dict[str, str] | None = None) -> httpx.Response:
    return await api.client.post("/v1/quotas/import", params={"dryRun": str(dry_run).lower()},
                                 content=document.encode(),
                                 headers={**(headers or api.admin), "Content-Type": "application/yaml"})


# --- auth on every new route ------------------------------------------------------------------------------

READS = ["/v1/cohorts", "/v1/flavors", "/v1/quotas", "/v1/usage", "/v1/quotas/export", "/v1/audit",
         "/v1/claims/vision/a/explain"]
WRITES = [("PUT", "/v1/cohorts/research", {}), ("DELETE", "/v1/cohorts/research", None),
          ("PUT", "/v1/flavors/custom", {"selector": "true"}), ("DELETE", "/v1/flavors/custom", None),
          ("POST", "/v1/quotas/import", None)]


@pytest.mark.parametrize("path", READS)
async def test_reads_need_a_token(api: Api, path: str) -> None:
    for headers in ({}, bearer("cb_wrong")):
        response = await api.client.get(path, headers=headers)
        assert_problem(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
async def test_viewers_cannot_write(api: Api, method: str, path: str, body: Any) -> None:
    await api.put("/v1/cohorts/research")
    await api.put("/v1/flavors/custom", {"selector": "true"})
    before = len(await api.audit())
    for headers in (api.viewer, api.scoped):
        kwargs: dict[str, Any] = {"json": body} if body is not None else {"content": QUOTAS.encode()}
        assert_problem(await api.client.request(method, path, headers=headers, **kwargs), 403)
    assert_problem(await api.client.request(method, path, json=body), 401)
    assert len(await api.audit()) == before, "a refused write leaves no trace"


async def test_audit_log_is_for_admins(api: Api) -> None:
    assert_problem(await api.client.get("/v1/audit", headers=api.viewer), 403)
    assert_problem(await api.client.get("/v1/audit", headers=api.scoped), 403)


# --- cohorts ----------------------------------------------------------------------------------------------


async def test_cohort_lifecycle(api: Api) -> None:
    created = await api.put("/v1/cohorts/research")
    assert created.status_code == 200
    assert created.json() == {"name": "research", "parent": None, "quotas": {}, "tenants": []}
    await api.put("/v1/tenants/vision", {"cohort": "research"})
    await api.put("/v1/tenants/speech", {"cohort": "shared"})
    listed = await api.client.get("/v1/cohorts", headers=api.viewer)
    assert listed.json() == [
        {"name": "research", "parent": None, "quotas": {}, "tenants": ["vision"]},
        {"name": "shared", "parent": None, "quotas": {}, "tenants": ["speech"]}]
    assert (await api.client.get("/v1/cohorts", headers=api.scoped)).json() == [
        {"name": "research", "parent": None, "quotas": {}, "tenants": ["vision"]}]

    in_use = assert_problem(await api.client.delete("/v1/cohorts/research", headers=api.admin), 409)
    assert "vision" in in_use["detail"]
    await api.put("/v1/tenants/vision", {})
    assert (await api.client.delete("/v1/cohorts/research", headers=api.admin)).status_code == 204
    assert_problem(await api.client.delete("/v1/cohorts/research", headers=api.admin), 404)
    assert (await api.put("/v1/cohorts/shared")).json() == {
        "name": "shared", "parent": None, "quotas": {}, "tenants": ["speech"]}
    entries = [(e.action, e.entity) for e in await api.audit() if e.entity.startswith("cohort/")]
    assert entries == [("put", "cohort/research"), ("delete", "cohort/research")], "an existing cohort is no write"
    assert_problem(await api.client.put("/v1/cohorts/x", json={"unknown": 1}, headers=api.admin), 422)


# --- flavors ----------------------------------------------------------------------------------------------


async def test_flavors_list_builtins_in_effective_order(api: Api) -> None:
    listed = (await api.client.get("/v1/flavors", headers=api.scoped)).json()
    assert [f["name"] for f in listed] == [f.name for f in BUILTIN_FLAVORS]
    h100 = next(f for f in listed if f["name"] == "H100")
    assert h100["builtIn"] is True and h100["value"] == 2.0 and h100["position"] is None


async def test_custom_flavors_come_first_and_override_builtins(api: Api) -> None:
    first = await api.put("/v1/flavors/fast", {"selector": "device.driver == 'gpu.nvidia.com'", "value": 3})
    assert first.json() == {"name": "fast", "selector": "device.driver == 'gpu.nvidia.com'", "value": 3.0,
                            "builtIn": False, "position": 0}
    await api.put("/v1/flavors/H100", {"selector": "true", "value": 9})
    listed = (await api.client.get("/v1/flavors", headers=api.viewer)).json()
    assert [(f["name"], f["builtIn"], f["value"]) for f in listed[:2]] == [("fast", False, 3.0), ("H100", False, 9.0)]
    assert sum(f["name"] == "H100" for f in listed) == 1
    await api.put("/v1/flavors/H100", {"selector": "true", "value": 9, "position": 0})
    await api.put("/v1/flavors/fast", {"selector": "true", "value": 3, "position": 1})
    listed = (await api.client.get("/v1/flavors", headers=api.viewer)).json()
    assert [f["name"] for f in listed[:2]] == ["H100", "fast"]

    # Deleting the override restores the built-in; a built-in itself cannot be deleted.
    assert (await api.client.delete("/v1/flavors/H100", headers=api.admin)).status_code == 204
    h100 = next(f for f in (await api.client.get("/v1/flavors", headers=api.viewer)).json() if f["name"] == "H100")
    assert h100["builtIn"] is True and h100["value"] == 2.0
    assert "built in" in assert_problem(await api.client.delete("/v1/flavors/H100", headers=api.admin), 409)["detail"]
    assert_problem(await api.client.delete("/v1/flavors/ghost", headers=api.admin), 404)

    # A custom flavor a quota uses stays until the quota goes.
    await api.put("/v1/tenants/vision")
    assert (await api.put("/v1/tenants/vision/quotas/fast", {"nominal": 1})).status_code == 200
    assert "vision" in assert_problem(await api.client.delete("/v1/flavors/fast", headers=api.admin), 409)["detail"]
    await api.client.delete("/v1/tenants/vision/quotas/fast", headers=api.admin)
    assert (await api.client.delete("/v1/flavors/fast", headers=api.admin)).status_code == 204
    assert [e.entity for e in await api.audit() if e.entity.startswith("flavor/")] == [
        "flavor/fast", "flavor/H100", "flavor/H100", "flavor/fast", "flavor/H100", "flavor/fast"]


@pytest.mark.parametrize("selector", ["device.driver ==", "device.attributes[", "1 +* 2"])
async def test_a_bad_selector_is_a_422_with_cels_message(api: Api, selector: str) -> None:
    problem = assert_problem(await api.put("/v1/flavors/broken", {"selector": selector}), 422)
    assert problem["title"] == "invalid selector" and "CEL" in problem["detail"]
    assert (await api.audit()) == []


# --- quota rules ------------------------------------------------------------------------------------------


async def test_quota_put_refuses_unknown_flavors_and_lending_above_nominal(api: Api) -> None:
    await api.put("/v1/tenants/vision")
    unknown = assert_problem(await api.put("/v1/tenants/vision/quotas/H1OO", {"nominal": 1}), 422)
    assert "H1OO" in unknown["detail"] and "H100" in unknown["detail"] and "A100-1g.10gb" in unknown["detail"]
    lending = assert_problem(await api.put("/v1/tenants/vision/quotas/H100", {"nominal": 2, "lendingLimit": 3}), 422)
    assert "lendingLimit" in lending["detail"]
    await api.put("/v1/flavors/custom", {"selector": "true"})
    assert (await api.put("/v1/tenants/vision/quotas/custom", {"nominal": 1})).status_code == 200
    await api.put("/v1/tenants/speech")
    await api.put("/v1/tenants/speech/quotas/H100", {"nominal": 3})
    assert [(q["tenant"], q["flavor"]) for q in (await api.client.get("/v1/quotas", headers=api.viewer)).json()] == [
        ("speech", "H100"), ("vision", "custom")]
    assert [q["tenant"] for q in (await api.client.get("/v1/quotas", headers=api.scoped)).json()] == ["vision"]


# --- import and export ------------------------------------------------------------------------------------


async def test_import_then_export_round_trips(api: Api) -> None:
    imported = await import_(api, QUOTAS)
    assert imported.status_code == 200, imported.text
    assert imported.json()["dryRun"] is False and imported.json()["exceeding"] == []
    exported = await api.client.get("/v1/quotas/export", headers=api.viewer)
    assert exported.headers["content-type"].startswith("application/yaml")
    assert parse_quotas(yaml.safe_load(exported.text)) == parse_quotas(yaml.safe_load(QUOTAS))
    as_json = await api.client.get("/v1/quotas/export", params={"format": "json"}, headers=api.viewer)
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json() == yaml.safe_load(exported.text)

    again = await import_(api, exported.text)
    assert again.json()["changes"] == [], "re-importing the export changes nothing"
    # JSON bodies are accepted too.
    again = await api.client.post("/v1/quotas/import", json=as_json.json(), headers=api.admin)
    assert again.status_code == 200 and again.json()["changes"] == []
    # The allocator's view of the ledger is the document's.
    async with api.factory() as s:
        assert await load_quota_config(s) == parse_quotas(yaml.safe_load(QUOTAS))


async def test_import_replaces_the_configuration_and_audits_each_row(api: Api) -> None:
    await api.put("/v1/tenants/legacy", {"cohort": "old"})
    await api.put("/v1/tenants/legacy/quotas/A100", {"nominal": 1})
    before = len(await api.audit())
    changes = (await import_(api, QUOTAS)).json()["changes"]
    entities = [(c["action"], c["entity"]) for c in changes]
    assert ("create", "flavor/H100") in entities and ("create", "quota/vision/A100-1g.10gb") in entities
    assert entities[-3:] == [("delete", "quota/legacy/A100"), ("delete", "tenant/legacy"), ("delete", "cohort/old")]
    vision = next(c for c in changes if c["entity"] == "tenant/vision")
    assert vision["before"] is None and vision["after"] == {
        "name": "vision", "cohort": "research", "weight": 2.0, "pendingAlertAfter": 300.0,
        "adminAccess": False, "maxPending": None,
        "minRuntime": None, "maxPreemptionsPerMinute": None, "gangReserveAfter": 600.0}
    audit = (await api.audit())[before:]
    assert [(e.entity, e.before, e.after) for e in audit] == [(c["entity"], c["before"], c["after"]) for c in changes]
    assert {e.actor for e in audit} == {f"token:{api.admin_id}"}

    exported = yaml.safe_load((await api.client.get("/v1/quotas/export", headers=api.admin)).text)
    exported["tenants"][1]["quotas"]["H100"]["nominal"] = 6
    changes = (await import_(api, yaml.safe_dump(exported))).json()["changes"]
    assert changes == [{"kind": "quota", "entity": "quota/vision/H100", "action": "update",
                        "before": {"tenant": "vision", "flavor": "H100", "nominal": 8, "borrowingLimit": 4,
                                   "lendingLimit": 2},
                        "after": {"tenant": "vision", "flavor": "H100", "nominal": 6, "borrowingLimit": 4,
                                  "lendingLimit": 2}}]


async def test_dry_run_changes_nothing_and_names_claims_over_their_new_quota(api: Api) -> None:
    await import_(api, QUOTAS)
    await add_claim(api, "vision", "train-a", flavor="H100", devices=7)
    await add_claim(api, "vision", "train-b", flavor="H100", devices=4)
    await add_claim(api, "speech", "asr", flavor="H100", devices=2)
    await add_claim(api, "vision", "small", flavor="A100-1g.10gb", devices=3, units=0.125)
    exported = (await api.client.get("/v1/quotas/export", headers=api.admin)).text
    audit_before = len(await api.audit())

    tighter = yaml.safe_load(QUOTAS)
    tighter["tenants"][1]["quotas"]["H100"] = {"nominal": 6, "borrowingLimit": 2}  # 11 held > 8
    tighter["tenants"][0]["quotas"]["H100"] = {"nominal": 2}  # no borrowing limit: never over
    response = await import_(api, yaml.safe_dump(tighter), dry_run=True)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["dryRun"] is True
    assert [(c["entity"], c["before"]["nominal"], c["after"]["nominal"]) for c in body["changes"]] == [
        ("quota/speech/H100", 2, 2), ("quota/vision/H100", 8, 6)]
    assert body["exceeding"] == [{
        "tenant": "vision", "flavor": "H100", "used": 11, "nominal": 6, "borrowingLimit": 2,
        "claims": [{"namespace": "vision", "name": "train-a", "devices": 7},
                   {"namespace": "vision", "name": "train-b", "devices": 4}]}]
    assert (await api.client.get("/v1/quotas/export", headers=api.admin)).text == exported
    assert len(await api.audit()) == audit_before, "a dry run writes nothing, not even audit rows"

    # The same document for real reports the same and writes it.
    real = (await import_(api, yaml.safe_dump(tighter))).json()
    assert real["dryRun"] is False and real["exceeding"] == body["exceeding"] and real["changes"] == body["changes"]
    assert len(await api.audit()) == audit_before + 2


@pytest.mark.parametrize(("document", "detail"), [
    ("kind: Quotas\ntenants: [{name: v, quotas: {H1OO: {nominal: 1}}}]", "H1OO"),
    ("kind: Quotas\ntenants: [{name: v, quotas: {H100: {nominal: 1, lendingLimit: 2}}}]", "lendingLimit"),
    ("kind: Quotas\nflavors: [{name: x, selector: 'device.driver =='}]", "CEL"),
    ("kind: Other", "kind"),
    ("{not: [yaml", "YAML"),
    ("", "kind"),
])
async def test_invalid_imports_are_422_problems(api: Api, document: str, detail: str) -> None:
    problem = assert_problem(await import_(api, document), 422)
    assert detail in problem["detail"]
    assert await api.audit() == []


async def test_scoped_viewer_exports_only_its_tenant(api: Api) -> None:
    await import_(api, QUOTAS)
    exported = yaml.safe_load((await api.client.get("/v1/quotas/export", headers=api.scoped)).text)
    assert [t["name"] for t in exported["tenants"]] == ["vision"]
    assert_problem(await api.client.get("/v1/quotas/export", params={"format": "xml"}, headers=api.admin), 422)


# --- usage ------------------------------------------------------------------------------------------------


async def test_usage_per_tenant_and_flavor(api: Api) -> None:
    open_fleet = (await api.client.get("/v1/usage", headers=api.viewer)).json()
    assert open_fleet == {"enforced": False, "items": [], "pending": [], "halfLife": 0.0, "shares": [], "cohorts": []}
    await import_(api, QUOTAS)
    await add_claim(api, "speech", "asr", flavor="H100", devices=5)  # nominal 2: borrows 3
    await add_claim(api, "vision", "train", flavor="H100", devices=4)  # nominal 8: 4 unused, lends at most 2
    await add_claim(api, "vision", "odd", flavor=None, devices=1, units=0.0)
    await add_claim(api, "vision", "wait-1", spec=gpu_claim(2), reason="quota",
                    explain={"flavors": ["H100", "A100"]})  # counted at the cheaper A100 (1 unit each)
    await add_claim(api, "vision", "wait-2", spec=gpu_claim(mode="All"))
    await add_claim(api, "audio", "wait-3", spec=gpu_claim(3))
    usage = (await api.client.get("/v1/usage", headers=api.viewer)).json()
    assert usage["enforced"] is True
    rows = {(r["tenant"], r["flavor"]): r for r in usage["items"]}
    assert rows[("speech", "H100")] == {
        "tenant": "speech", "cohort": "research", "flavor": "H100", "nominal": 2, "borrowingLimit": 0,
        "lendingLimit": None, "used": 5, "usedUnits": 10.0, "borrowed": 3, "lent": 0, "pending": 0,
        "pendingUnits": 0.0}
    assert rows[("vision", "H100")] | {} == {
        "tenant": "vision", "cohort": "research", "flavor": "H100", "nominal": 8, "borrowingLimit": 4,
        "lendingLimit": 2, "used": 4, "usedUnits": 8.0, "borrowed": 0, "lent": 2, "pending": 0,
        "pendingUnits": 0.0}
    assert (rows[("vision", "A100")]["pending"], rows[("vision", "A100")]["pendingUnits"]) == (2, 2.0)
    assert rows[("vision", "A100-1g.10gb")]["used"] == 0 and rows[("vision", "A100-1g.10gb")]["nominal"] == 14
    assert rows[("vision", None)]["used"] == 1
    assert usage["pending"] == [{"tenant": "audio", "claims": 1, "devices": 3, "units": 0.0},
                                {"tenant": "vision", "claims": 2, "devices": 3, "units": 2.0}]

    scoped = (await api.client.get("/v1/usage", headers=api.scoped)).json()
    assert {r["tenant"] for r in scoped["items"]} == {"vision"}
    assert scoped["pending"] == [{"tenant": "vision", "claims": 2, "devices": 3, "units": 2.0}]
    assert next(r for r in scoped["items"] if r["flavor"] == "H100")["lent"] == 2, "lent counts the whole cohort"


def test_requested_devices_reads_every_request_shape() -> None:
    assert requested_devices(gpu_claim(3)) == 3
    assert requested_devices(gpu_claim(mode="All")) == 1
    assert requested_devices({"spec": {"devices": {"requests": [
        {"name": "a", "deviceClassName": "gpu.nvidia.com", "count": 2},
        {"name": "b", "firstAvailable": [{"name": "big", "count": 4}, {"name": "small", "count": 1}]},
        {"name": "c", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}) == 7
    assert requested_devices({}) == 0 and requested_devices({"spec": "nonsense"}) == 0


# --- claims -----------------------------------------------------------------------------------------------


async def test_claims_page_and_filter(api: Api) -> None:
    for i in range(5):
        await add_claim(api, "vision", f"c{i}", flavor="H100", devices=1, node=f"node-{i % 2}")
    await add_claim(api, "speech", "s0", reason="waits")
    page = (await api.client.get("/v1/claims", params={"limit": 2}, headers=api.viewer)).json()
    assert [c["name"] for c in page["items"]] == ["c0", "c1"] and page["next"] is not None
    names = [c["name"] for c in page["items"]]
    while page["next"] is not None:
        page = (await api.client.get("/v1/claims", params={"limit": 2, "cursor": page["next"]},
                                     headers=api.viewer)).json()
        names += [c["name"] for c in page["items"]]
    assert names == ["c0", "c1", "c2", "c3", "c4", "s0"]
    on_node = (await api.client.get("/v1/claims", params={"node": "node-1"}, headers=api.viewer)).json()
    assert [c["name"] for c in on_node["items"]] == ["c1", "c3"] and on_node["next"] is None
    scoped = (await api.client.get("/v1/claims", params={"limit": 1000}, headers=api.scoped)).json()
    assert {c["namespace"] for c in scoped["items"]} == {"vision"}
    for limit in (0, 1001):
        assert_problem(await api.client.get("/v1/claims", params={"limit": limit}, headers=api.viewer), 422)
    for cursor in (-1, 2**63):  # past a 64-bit id: refused, not a database error
        assert_problem(await api.client.get("/v1/claims", params={"cursor": cursor}, headers=api.viewer), 422)


async def test_claim_history_and_explain(api: Api) -> None:
    why = {"blockingQuotas": [{"flavor": "H100", "nominal": 2, "used": 2}], "shortfall": 1}
    claim_id = await add_claim(api, "vision", "waits", reason="quota H100 exhausted", explain=why)
    await add_claim(api, "vision", "plain", reason="waits")
    async with api.factory() as s, s.begin():
        s.add_all([ClaimEvent(claim_id=claim_id, sequence=2, state="Pending", reason="quota H100 exhausted"),
                   ClaimEvent(claim_id=claim_id, sequence=1, state="Allocated", node="node-01"),
                   ClaimEvent(claim_id=claim_id, sequence=3, state="Preempted", by="speech/urgent")])
    detail = (await api.client.get("/v1/claims/vision/waits", headers=api.scoped)).json()
    assert [(e["sequence"], e["state"], e["node"], e["by"]) for e in detail["history"]] == [
        (1, "Allocated", "node-01", None), (2, "Pending", None, None), (3, "Preempted", None, "speech/urgent")]
    assert detail["history"][0]["at"].endswith(("Z", "+00:00"))
    explained = (await api.client.get("/v1/claims/vision/waits/explain", headers=api.scoped)).json()
    assert explained == {"namespace": "vision", "name": "waits", "state": "Pending",
                         "reason": "quota H100 exhausted", "explain": why, "estimatedStart": None,
                         "estimatedStartReason": None}
    plain = (await api.client.get("/v1/claims/vision/plain/explain", headers=api.viewer)).json()
    assert plain["explain"] is None and plain["state"] == "Pending" and plain["reason"] == "waits"
    assert_problem(await api.client.get("/v1/claims/vision/ghost/explain", headers=api.viewer), 404)
    assert_problem(await api.client.get("/v1/claims/speech/x/explain", headers=api.scoped), 404)


# --- audit log --------------------------------------------------------------------------------------------


async def test_audit_log_reads_newest_first_with_filters(api: Api) -> None:
    await api.put("/v1/tenants/vision", {"weight": 2})
    await api.put("/v1/tenants/vision/quotas/H100", {"nominal": 4})
    await api.put("/v1/tenants/vision/quotas/H100", {"nominal": 6})
    await api.put("/v1/flavors/custom", {"selector": "true"})
    entries = (await api.client.get("/v1/audit", headers=api.admin)).json()
    assert [(e["action"], e["entity"]) for e in entries] == [
        ("put", "flavor/custom"), ("put", "quota/vision/H100"), ("put", "quota/vision/H100"),
        ("put", "tenant/vision"), ("put", "token/3"), ("put", "token/2"), ("put", "token/1")]  # the fixture's
    newest = entries[1]
    assert newest["actor"] == f"token:{api.admin_id}" and newest["at"].endswith(("Z", "+00:00"))
    assert newest["before"]["nominal"] == 4 and newest["after"]["nominal"] == 6
    quotas = (await api.client.get("/v1/audit", params={"entity": "quota/"}, headers=api.admin)).json()
    assert [e["after"]["nominal"] for e in quotas] == [6, 4]
    assert len((await api.client.get("/v1/audit", params={"limit": 1}, headers=api.admin)).json()) == 1
    assert (await api.client.get("/v1/audit", params={"entity": "quota_"}, headers=api.admin)).json() == [], (
        "the prefix is literal, not a LIKE pattern")


# --- the ledger model -------------------------------------------------------------------------------------


async def test_load_and_apply_quota_config(api: Api) -> None:
    config = parse_quotas(yaml.safe_load(QUOTAS))
    async with api.factory() as s, s.begin():
        changes = await apply_quota_config(s, config, "test")
    assert {c.kind for c in changes} == {"cohort", "flavor", "tenant", "quota"}
    async with api.factory() as s:
        loaded = await load_quota_config(s)
    assert loaded == config and loaded.enforced
    assert [f.name for f in loaded.flavors[:2]] == ["H100", "big-memory"]
    async with api.factory() as s, s.begin():
        assert await apply_quota_config(s, config, "test") == []


async def test_openapi_documents_new_routes_and_problems(api: Api) -> None:
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    assert {"/v1/cohorts", "/v1/cohorts/{name}", "/v1/flavors", "/v1/flavors/{name}", "/v1/quotas",
            "/v1/quotas/export", "/v1/quotas/import", "/v1/usage", "/v1/claims/{namespace}/{name}/explain",
            "/v1/audit"} <= set(paths)
    assert "/" not in paths, "the page is HTML, not part of the API document"
    put_flavor = paths["/v1/flavors/{name}"]["put"]["responses"]
    assert {"401", "403", "422"} <= set(put_flavor) and PROBLEM in put_flavor["422"]["content"]
    assert PROBLEM in paths["/v1/cohorts/{name}"]["delete"]["responses"]["409"]["content"]
    assert "application/yaml" in paths["/v1/quotas/import"]["post"]["requestBody"]["content"]


# --- schemathesis -----------------------------------------------------------------------------------------
# Driven with hypothesis directly (schemathesis' pytest plugin does not run under pytest 9): one test per
# operation of the document, each with a bounded number of generated requests, in-process over ASGI.


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[tuple[Any, dict[str, str]]]:
    """One SQLite ledger for the run; schemathesis calls the app on its own event loop thread."""
    import tempfile

    import schemathesis

    with tempfile.TemporaryDirectory(prefix="cb-fuzz-") as folder:
        url = f"sqlite+aiosqlite:///{Path(folder) / 'ledger.db'}"

        async def prepare() -> str:
            await migrate(url)
            engine = create_engine(url)
            token = await create_token(sessions(engine), "admin", None)
            await engine.dispose()
            return token

        token = asyncio.run(prepare())

        async def no_nodes() -> Fleet:  # what-if and the node map answer on an empty fleet, not a 503
            return Fleet()

        app = create_app(create_engine(url), fleet=no_nodes)
        yield schemathesis.openapi.from_asgi("/openapi.json", app), bearer(token)


def _operations() -> list[str]:
    engine = create_engine("sqlite+aiosqlite:///:memory:")  # never connected: only the document is read
    paths = create_app(engine).openapi()["paths"]
    # /v1/events is an endless stream (503 without a bus): tests/e2e/test_live_feed.py reads it
    return [f"{method.upper()} {path}" for path, methods in paths.items() for method in methods
            if path != "/v1/events"]


@pytest.mark.parametrize("label", _operations())
def test_openapi_document_holds(fuzzed: tuple[Any, dict[str, str]], label: str) -> None:
    """No 5xx, and every response matches the document, for generated requests with an admin token."""
    from hypothesis import given
    from schemathesis.checks import not_a_server_error, response_schema_conformance

    schema, headers = fuzzed
    operation = schema.find_operation_by_label(label)

    @given(case=operation.as_strategy())
    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: Any) -> None:
        case.call_and_validate(headers=headers, checks=[not_a_server_error, response_schema_conformance])

    check()
