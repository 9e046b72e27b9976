"""The admin API serves a waiting claim's last published start estimate (estimatedStart) with the claim and
its explanation, on SQLite and PostgreSQL; a claim that no longer waits shows none."""

from __future__ import annotations

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
