"""GET /v1/waiting: the queue grouped by tenant and reason, with waits per tenant; a tenant-scoped viewer
sees its tenant only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.ledger.schema import Claim, Tenant
from tests.integration.admin import Api


def spec(count: int) -> dict[str, object]:
    return {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                         "count": count}}]}}}


async def test_the_queue_grouped_by_tenant_and_reason(api: Api) -> None:
    full = "Insufficient nvidia.com/gpu: requested 1, free 0 of 8 on 1 node"
    now = datetime.now(UTC)  # at the test, not at collection: the suite may reach it minutes later
    async with api.factory() as s, s.begin():
        s.add(Tenant(name="vision", pending_alert_after_s=60.0))
        s.add_all([Claim(namespace="vision", name=f"v{i}", state="Pending", spec=spec(1 + i % 2), sequence=1,
                         reason=full, submitted_at=now - timedelta(seconds=30 * (i + 1))) for i in range(4)])
        s.add(Claim(namespace="vision", name="typo", state="Pending", spec=spec(8), sequence=1, reason=None,
                    submitted_at=now - timedelta(seconds=5)))
        s.add(Claim(namespace="speech", name="s0", state="Pending", spec=spec(2), sequence=1, reason=full,
                    submitted_at=now - timedelta(hours=1)))
        s.add(Claim(namespace="speech", name="done", state="Allocated", spec=spec(1), sequence=1))
    body = (await api.client.get("/v1/waiting", headers=api.viewer)).json()
    assert [(g["tenant"], g["reason"], g["claims"], g["devices"]) for g in body["groups"]] == [
        ("vision", full, 4, 6), ("speech", full, 1, 2), ("vision", "not decided yet", 1, 8)]
    assert body["groups"][0]["oldestWaitSeconds"] >= 120
    waits = {t["tenant"]: t for t in body["tenants"]}
    assert waits["vision"]["waiting"] == 5 and waits["vision"]["pastAlertAfter"] == 3  # its own 60 s
    assert waits["speech"]["pastAlertAfter"] == 1  # the broker's 600 s
    assert waits["vision"]["p50WaitSeconds"] <= waits["vision"]["p90WaitSeconds"] <= waits["vision"]["maxWaitSeconds"]
    scoped = (await api.client.get("/v1/waiting", headers=api.scoped)).json()
    assert {g["tenant"] for g in scoped["groups"]} == {"vision"}
    assert [t["tenant"] for t in scoped["tenants"]] == ["vision"]
    assert (await api.client.get("/v1/waiting")).status_code == 401
