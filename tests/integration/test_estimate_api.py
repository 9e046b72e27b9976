"""The admin API serves a waiting claim's last published start estimate (estimatedStart, or a null one with its
estimatedStartReason) with the claim and its explanation, on SQLite and PostgreSQL; a claim that no longer waits
shows none."""

from __future__ import annotations

import pytest

from shared.ledger.schema import Claim
from tests.integration.admin import Api

ESTIMATE = {"p50": "2026-12-01T12:20:00Z", "p90": "2026-12-01T12:40:00Z", "blockedBy": ["vision/train"]}


async def test_claims_and_explain_carry_the_estimate(api: Api) -> None:
    async with api.factory() as s, s.begin():
        s.add_all([
            Claim(namespace="vision", name="waits", state="Pending", spec={}, reason="no room", sequence=2,
                  estimated_start=ESTIMATE, estimate_p50=1.0, explain={"state": "Pending"}),
            Claim(namespace="vision", name="plain", state="Pending", spec={}, reason="no room", sequence=1),
            Claim(namespace="vision", name="withdrawn", state="Released", spec={}, sequence=3,
                  estimated_start=ESTIMATE),
        ])
    one = (await api.client.get("/v1/claims/vision/waits", headers=api.viewer)).json()
    assert one["estimatedStart"] == ESTIMATE
    explained = (await api.client.get("/v1/claims/vision/waits/explain", headers=api.viewer)).json()
    assert explained["estimatedStart"] == ESTIMATE and explained["explain"] == {"state": "Pending"}
    listed = (await api.client.get("/v1/claims", headers=api.viewer)).json()["items"]
    assert {c["name"]: c["estimatedStart"] for c in listed} == {"waits": ESTIMATE, "plain": None, "withdrawn": None}
    withdrawn = (await api.client.get("/v1/claims/vision/withdrawn/explain", headers=api.viewer)).json()
    assert withdrawn["estimatedStart"] is None


async def test_a_null_estimate_is_served_with_its_reason(api: Api) -> None:
    why = "no device of today's fleet could ever satisfy it as written"
    async with api.factory() as s, s.begin():
        s.add_all([
            Claim(namespace="vision", name="never", state="Pending", spec={}, reason="no room", sequence=2,
                  estimated_start=None, estimate_reason=why, explain={"state": "Pending"}),
            Claim(namespace="vision", name="waits", state="Pending", spec={}, reason="no room", sequence=2,
                  estimated_start=ESTIMATE, estimate_p50=1.0),
            Claim(namespace="vision", name="gave-up", state="Released", spec={}, sequence=3, estimate_reason=why),
        ])
    listed = (await api.client.get("/v1/claims", headers=api.viewer)).json()["items"]
    assert {c["name"]: (c["estimatedStart"], c["estimatedStartReason"]) for c in listed} == {
        "never": (None, why), "waits": (ESTIMATE, None), "gave-up": (None, None)}, "Pending only"
    one = (await api.client.get("/v1/claims/vision/never", headers=api.viewer)).json()
    assert (one["estimatedStart"], one["estimatedStartReason"]) == (None, why)
    explained = (await api.client.get("/v1/claims/vision/never/explain", headers=api.viewer)).json()
    assert (explained["estimatedStart"], explained["estimatedStartReason"]) == (None, why)
    gone = (await api.client.get("/v1/claims/vision/gave-up/explain", headers=api.viewer)).json()
    assert gone["estimatedStartReason"] is None


async def test_estimates_error_per_tenant_and_flavor(api: Api) -> None:
    import time
    from datetime import UTC, datetime

    now = time.time()
    started = datetime.fromtimestamp(now - 600, UTC)
    async with api.factory() as s, s.begin():
        s.add_all([
            Claim(namespace="vision", name="early", state="Allocated", spec={}, sequence=4, flavor="H100",
                  allocated_at=started, first_estimate_p50=now - 600 + 120, estimate_p50=now - 600 - 30),
            Claim(namespace="vision", name="late", state="Released", spec={}, sequence=6, flavor="H100",
                  allocated_at=started, first_estimate_p50=now - 600 - 60, estimate_p50=now - 600 - 10),
            Claim(namespace="speech", name="asr", state="Allocated", spec={}, sequence=3, flavor=None,
                  allocated_at=started, first_estimate_p50=now - 600, estimate_p50=now - 600 + 5),
            Claim(namespace="speech", name="never-estimated", state="Allocated", spec={}, sequence=2,
                  allocated_at=started),
            Claim(namespace="speech", name="long-ago", state="Released", spec={}, sequence=2,
                  allocated_at=datetime.fromtimestamp(now - 3 * 86400, UTC), estimate_p50=1.0),
        ])
    result = (await api.client.get("/v1/estimates", params={"window": 86400}, headers=api.viewer)).json()
    assert result["overall"]["claims"] == 3
    groups = {(g["tenant"], g["flavor"]): g for g in result["groups"]}
    vision = groups[("vision", "H100")]
    assert vision["claims"] == 2
    assert (vision["firstP50"], vision["firstP90"]) == (pytest.approx(60, abs=1), pytest.approx(120, abs=1))
    assert (vision["lastP50"], vision["lastP90"]) == (pytest.approx(10, abs=1), pytest.approx(30, abs=1))
    assert groups[("speech", None)]["lastP50"] == pytest.approx(5, abs=1)
    scoped = (await api.client.get("/v1/estimates", params={"window": 86400}, headers=api.scoped)).json()
    assert {g["tenant"] for g in scoped["groups"]} == {"vision"}, "a tenant's token sees its own"
    wide = (await api.client.get("/v1/estimates", params={"window": 7 * 86400}, headers=api.viewer)).json()
    assert wide["overall"]["claims"] == 4
    assert (await api.client.get("/v1/estimates", params={"window": 0}, headers=api.viewer)).status_code == 422
