"""Nested cohorts and fair sharing's half-life in the ledger and the admin API, on SQLite and PostgreSQL
(contract, Quotas; issue 41): migration 0016 up and down, its configuration tables moving config_revision;
a three-level tree with a half-life imported and exported unchanged and read by the allocator as the
document says; the API and `quota import` refusing a cycle or an unknown parent with a 4xx naming the
cohorts, and writing nothing then; cohorts' own quotas and the half-life edited, read and audited."""

from __future__ import annotations

import math
import time
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import func, select, text

from shared.admission.quota import CohortQuota, QuotaLimit, parse_quotas
from shared.ledger.engine import create_engine, downgrade, migrate
from shared.ledger.quota_store import load_quota_config
from shared.ledger.schema import AuditEntry, Cohort, CohortQuotaRow, PastUse, QuotaSettings
from tests.integration.admin import Api, assert_problem
from tests.integration.test_admin_quota_api import add_claim
from tests.integration.test_migrations import columns

THREE_LEVELS = """\
kind: Quotas
fairSharing: {halfLife: 24h}
cohorts:
  - name: org
    quotas:
      H100: {nominal: 16, borrowingLimit: 0}
  - name: research
    parent: org
    quotas:
      H100: {nominal: 8, borrowingLimit: 8, lendingLimit: 4}
  - name: vision-team
    parent: research
tenants:
  - name: vision
    cohort: vision-team
    weight: 1.0
    quotas:
      H100: {nominal: 4, borrowingLimit: 4}
  - name: speech
    cohort: research
    quotas:
      H100: {nominal: 2}
"""


async def _import(api: Api, document: str, *, dry_run: bool = False) -> httpx.Response:
    return await api.client.post("/v1/quotas/import", params={"dryRun": str(dry_run).lower()},
                                 content=document.encode(),
                                 headers={**api.admin, "Content-Type": "application/yaml"})


async def _written(api: Api) -> tuple[Any, ...]:
    """Everything a refused write must leave as it was: cohorts with parents, cohort quotas, the half-life,
    the audit log's length."""
    async with api.factory() as s:
        return (sorted((c.name, c.parent) for c in await s.scalars(select(Cohort))),
                sorted((q.cohort, q.flavor, q.nominal) for q in await s.scalars(select(CohortQuotaRow))),
                await s.scalar(select(QuotaSettings.half_life_s)),
                await s.scalar(select(func.count()).select_from(AuditEntry)))


# --- migration 0016 ---------------------------------------------------------------------------------------


async def execute(url: str, *statements: str) -> list[tuple[Any, ...]]:
    """The statements in one transaction; the last one's rows, if it returns any."""
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            result = None
            for statement in statements:
                result = await connection.execute(text(statement))
            return [tuple(row) for row in result] if result is not None and result.returns_rows else []
    finally:
        await engine.dispose()


async def test_0016_adds_the_tree_half_life_and_past_use_and_takes_them_back(db_url: str) -> None:
    await migrate(db_url, "0015")
    await execute(db_url, "INSERT INTO cohorts (name) VALUES ('org')",
                   "INSERT INTO tenants (name, cohort, weight, admin_access) VALUES ('vision', 'org', 1.0, false)")
    await migrate(db_url)
    assert await execute(db_url, "SELECT name, parent FROM cohorts") == [("org", None)], "a cohort from before: top"
    assert await execute(db_url, "SELECT half_life_s FROM quota_settings WHERE id = 1") == [(0.0,)], "off"

    async def revision() -> int:
        return int((await execute(db_url, "SELECT revision FROM config_revision WHERE id = 1"))[0][0])

    for statement in ["INSERT INTO cohorts (name, parent) VALUES ('research', 'org')",
                      "UPDATE cohorts SET parent = NULL WHERE name = 'research'",
                      "INSERT INTO cohort_quotas (cohort, flavor, nominal) VALUES ('org', 'H100', 8)",
                      "UPDATE cohort_quotas SET nominal = 16",
                      "UPDATE quota_settings SET half_life_s = 86400",
                      "DELETE FROM cohort_quotas"]:
        before = await revision()
        await execute(db_url, statement)
        assert await revision() > before, statement
    before = await revision()
    await execute(db_url, "INSERT INTO past_use (tenant, flavor, units, as_of) VALUES ('vision', 'H100', 4, 1)")
    assert await revision() == before, "past use is no configuration: the allocator's own writes move nothing"

    await execute(db_url, "UPDATE cohorts SET parent = 'org' WHERE name = 'research'",
                   "INSERT INTO cohort_quotas (cohort, flavor, nominal) VALUES ('research', 'H100', 8)")
    await downgrade(db_url, "0015")
    found = await columns(db_url)
    assert "parent" not in found["cohorts"]
    assert not {"cohort_quotas", "quota_settings", "past_use"} & set(found)
    assert await execute(db_url, "SELECT name FROM cohorts ORDER BY name") == [("org",), ("research",)]
    before = await revision()
    await execute(db_url, "INSERT INTO cohorts (name) VALUES ('after')")
    assert await revision() > before, "0015's triggers on cohorts are still there"
    await migrate(db_url)
    assert await execute(db_url, "SELECT name, parent FROM cohorts ORDER BY name") == [
        ("after", None), ("org", None), ("research", None)]


# --- import and export ------------------------------------------------------------------------------------


async def test_a_three_level_tree_with_a_half_life_round_trips(api: Api) -> None:
    imported = await _import(api, THREE_LEVELS)
    assert imported.status_code == 200, imported.text
    entities = [(c["kind"], c["entity"]) for c in imported.json()["changes"]]
    assert ("fair-sharing", "fair-sharing") in entities and ("cohort-quota", "cohort-quota/research/H100") in entities
    wanted = parse_quotas(yaml.safe_load(THREE_LEVELS))
    async with api.factory() as s:
        loaded = await load_quota_config(s)
    assert loaded.half_life == 86400.0
    assert loaded.cohort_tree == wanted.cohort_tree == {
        "org": CohortQuota("org", None, {"H100": QuotaLimit(16, 0, None)}),
        "research": CohortQuota("research", "org", {"H100": QuotaLimit(8, 8, 4)}),
        "vision-team": CohortQuota("vision-team", "research", {})}
    assert loaded.tenants == wanted.tenants and loaded.ancestors("vision-team") == ["vision-team", "research", "org"]

    exported = await api.client.get("/v1/quotas/export", headers=api.viewer)
    document = yaml.safe_load(exported.text)
    assert document["fairSharing"] == {"halfLife": "1d"}
    assert parse_quotas(document) == loaded
    again = await _import(api, exported.text)
    assert again.json()["changes"] == [], "re-importing the export changes nothing"

    flat = yaml.safe_load(THREE_LEVELS)  # the tree taken apart: parents, cohort quotas and half-life go
    flat.pop("fairSharing")
    flat["cohorts"] = [{"name": "org"}, {"name": "research"}, {"name": "vision-team"}]
    changes = (await _import(api, yaml.safe_dump(flat))).json()["changes"]
    assert {(c["entity"], c["action"]) for c in changes} == {
        ("fair-sharing", "update"), ("cohort/research", "update"), ("cohort/vision-team", "update"),
        ("cohort-quota/org/H100", "delete"), ("cohort-quota/research/H100", "delete")}
    async with api.factory() as s:
        loaded = await load_quota_config(s)
    assert (loaded.half_life, dict(loaded.cohort_tree), loaded.nested) == (0.0, {}, False)


async def test_an_import_without_the_tree_deletes_it_children_first(api: Api) -> None:
    await _import(api, THREE_LEVELS)
    emptied = await _import(api, "kind: Quotas\n")
    assert emptied.status_code == 200, emptied.text
    gone = [c["entity"] for c in emptied.json()["changes"] if c["kind"] == "cohort"]
    assert gone == ["cohort/vision-team", "cohort/research", "cohort/org"]
    assert await _written(api) == ([], [], 0.0, len(await api.audit()) + 3)  # the fixture's three token rows


@pytest.mark.parametrize(("cohorts", "detail"), [
    ("[{name: a, parent: b}, {name: b, parent: a}]", "a -> b -> a"),
    ("[{name: a, parent: a}]", "a -> a"),
    ("[{name: a, parent: nowhere}]", "'nowhere'"),
])
async def test_import_refuses_a_cycle_or_an_unknown_parent_and_writes_nothing(api: Api, cohorts: str,
                                                                              detail: str) -> None:
    await _import(api, THREE_LEVELS)
    before = await _written(api)
    problem = assert_problem(await _import(api, f"kind: Quotas\ncohorts: {cohorts}\n"), 422)
    assert detail in problem["detail"]
    assert await _written(api) == before


# --- cohorts in the admin API -----------------------------------------------------------------------------


async def test_cohorts_nest_with_quotas_of_their_own(api: Api) -> None:
    assert (await api.put("/v1/cohorts/org", {"quotas": {"H100": {"nominal": 16}}})).status_code == 200
    made = await api.put("/v1/cohorts/research", {"parent": "org",
                                                  "quotas": {"H100": {"nominal": 8, "lendingLimit": 4}}})
    assert made.status_code == 200, made.text
    assert made.json() == {"name": "research", "parent": "org", "tenants": [],
                           "quotas": {"H100": {"nominal": 8, "borrowingLimit": None, "lendingLimit": 4}}}
    await api.put("/v1/tenants/vision", {"cohort": "research"})
    read = await api.client.get("/v1/cohorts/research", headers=api.viewer)
    assert read.json()["parent"] == "org" and read.json()["tenants"] == ["vision"]
    assert (await api.client.get("/v1/cohorts/research", headers=api.scoped)).status_code == 200
    assert_problem(await api.client.get("/v1/cohorts/org", headers=api.scoped), 404)  # not its tenant's cohort

    kept = await api.put("/v1/cohorts/research", {"quotas": {"H100": {"nominal": 6}}})  # parent left out: kept
    assert kept.json()["parent"] == "org" and kept.json()["quotas"]["H100"]["nominal"] == 6
    async with api.factory() as s:
        config = await load_quota_config(s)
    assert config.cohort("research") == CohortQuota("research", "org", {"H100": QuotaLimit(6)})
    assert config.cohort("org").quotas == {"H100": QuotaLimit(16)}

    audit = [(e.entity, e.before, e.after) for e in await api.audit() if e.entity == "cohort/research"]
    assert audit[-1] == ("cohort/research",
                         {"name": "research", "parent": "org",
                          "quotas": {"H100": {"nominal": 8, "borrowingLimit": None, "lendingLimit": 4}}},
                         {"name": "research", "parent": "org",
                          "quotas": {"H100": {"nominal": 6, "borrowingLimit": None, "lendingLimit": None}}})

    in_use = assert_problem(await api.client.delete("/v1/cohorts/org", headers=api.admin), 409)
    assert "research" in in_use["detail"], "a parent stays while cohorts nest in it"
    await api.put("/v1/flavors/fpga", {"selector": "device.driver == 'fpga.example.com'"})
    await api.put("/v1/cohorts/org", {"quotas": {"H100": {"nominal": 16}, "fpga": {"nominal": 2}}})
    used = assert_problem(await api.client.delete("/v1/flavors/fpga", headers=api.admin), 409)
    assert "cohort org" in used["detail"], "a flavor a cohort's quota uses stays"
    await api.put("/v1/tenants/vision", {})
    assert (await api.client.delete("/v1/cohorts/research", headers=api.admin)).status_code == 204
    async with api.factory() as s:
        assert list(await s.scalars(select(CohortQuotaRow.cohort).distinct())) == ["org"], "its quotas went with it"


@pytest.mark.parametrize(("name", "body", "detail"), [
    ("org", {"parent": "team"}, "org -> team -> research -> org"),
    ("org", {"parent": "org"}, "org -> org"),
    ("team", {"parent": "nowhere"}, "'nowhere'"),
    ("fresh", {"parent": "nowhere"}, "'nowhere'"),
    ("team", {"quotas": {"H1OO": {"nominal": 1}}}, "H1OO"),
    ("team", {"quotas": {"H100": {"nominal": 1, "lendingLimit": 2}}}, "lendingLimit"),
])
async def test_a_cycle_an_unknown_parent_or_a_bad_quota_is_refused_and_nothing_is_written(
        api: Api, name: str, body: dict[str, Any], detail: str) -> None:
    await api.put("/v1/cohorts/org")
    await api.put("/v1/cohorts/research", {"parent": "org"})
    await api.put("/v1/cohorts/team", {"parent": "research", "quotas": {"H100": {"nominal": 2}}})
    before = await _written(api)
    problem = assert_problem(await api.client.put(f"/v1/cohorts/{name}", json=body, headers=api.admin), 422)
    assert detail in problem["detail"], problem
    assert await _written(api) == before


async def test_the_half_life_is_read_and_set_through_the_api(api: Api) -> None:
    assert (await api.client.get("/v1/fair-sharing", headers=api.viewer)).json() == {"halfLife": 0.0}
    assert_problem(await api.client.put("/v1/fair-sharing", json={"halfLife": 3600}, headers=api.viewer), 403)
    assert_problem(await api.client.put("/v1/fair-sharing", json={"halfLife": -1}, headers=api.admin), 422)
    assert (await api.client.put("/v1/fair-sharing", json={"halfLife": 3600},
                                 headers=api.admin)).json() == {"halfLife": 3600.0}
    async with api.factory() as s:
        assert (await load_quota_config(s)).half_life == 3600.0
    assert [(e.entity, e.before, e.after) for e in await api.audit()] == [
        ("fair-sharing", {"halfLife": 0.0}, {"halfLife": 3600.0})]
    exported = yaml.safe_load((await api.client.get("/v1/quotas/export", headers=api.admin)).text)
    assert exported["fairSharing"] == {"halfLife": "1h"}


async def test_openapi_documents_the_tree_and_fair_sharing(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    assert {"get", "put"} <= set(document["paths"]["/v1/fair-sharing"])
    assert {"get", "put", "delete"} <= set(document["paths"]["/v1/cohorts/{name}"])
    assert "422" in document["paths"]["/v1/cohorts/{name}"]["put"]["responses"]
    cohort_in = document["components"]["schemas"]["CohortIn"]["properties"]
    assert {"parent", "quotas"} <= set(cohort_in)


# --- usage: shares with past use, the tree per level ------------------------------------------------------


async def test_usage_shows_shares_with_past_use_and_the_tree_per_level(api: Api) -> None:
    """vision (weight 1) holds 3 H100s (6 units) and held 4 before: share 10, and its past use never halves
    while it holds more than half of it. speech holds 2 (4 units) after 10: share 14, halving in
    log2((10 - 4) / (5 - 4)) half-lives. The tree: vision-team holds 3 of its 4, research 5 of 14 (its own 8
    and its tenants' and team's), org 5 of 30."""
    await _import(api, THREE_LEVELS)
    await add_claim(api, "vision", "train", flavor="H100", devices=3)
    await add_claim(api, "speech", "asr", flavor="H100", devices=2)
    async with api.factory() as s, s.begin():
        now = time.time()
        s.add_all([PastUse(tenant="vision", flavor="H100", units=4.0, as_of=now),
                   PastUse(tenant="speech", flavor="H100", units=10.0, as_of=now)])
    usage = (await api.client.get("/v1/usage", headers=api.viewer)).json()
    assert usage["halfLife"] == 86400.0
    shares = {share["tenant"]: share for share in usage["shares"]}
    assert [share["tenant"] for share in usage["shares"]] == ["vision", "speech"], "lowest share first"
    assert shares["vision"] == {"tenant": "vision", "weight": 1.0, "inUse": 6.0,
                                "pastUse": pytest.approx(4.0, abs=1e-3), "share": pytest.approx(10.0, abs=1e-3),
                                "halvesIn": None}
    assert shares["speech"]["halvesIn"] == pytest.approx(86400 * math.log2(6), abs=60)
    tree = [(c["name"], c["depth"], [(f["flavor"], f["used"], f["nominal"], f["ownNominal"]) for f in c["flavors"]])
            for c in usage["cohorts"]]
    assert tree == [("org", 0, [("H100", 5, 30, 16)]), ("research", 1, [("H100", 5, 14, 8)]),
                    ("vision-team", 2, [("H100", 3, 4, 0)])]

    scoped = (await api.client.get("/v1/usage", headers=api.scoped)).json()
    assert [share["tenant"] for share in scoped["shares"]] == ["vision"]
    assert [c["name"] for c in scoped["cohorts"]] == ["org", "research", "vision-team"], "its cohort's ancestry"
    # nor does its export name other cohorts (a sibling organisation)
    assert (await api.client.put("/v1/cohorts/other-org", json={}, headers=api.admin)).status_code in (200, 201)
    exported = yaml.safe_load((await api.client.get("/v1/quotas/export", headers=api.scoped)).text)
    assert [c["name"] for c in exported["cohorts"]] == ["org", "research", "vision-team"]
    assert [t["name"] for t in exported["tenants"]] == ["vision"]
