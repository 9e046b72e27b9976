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


async def test_how_long_the_claims_admitted_in_the_window_waited_per_tenant_and_flavor(api: Api) -> None:
    now = datetime.now(UTC)

    def admitted(tenant: str, name: str, flavor: str | None, waited_s: float, ago_s: float,
                 state: str = "Allocated") -> Claim:
        allocated = now - timedelta(seconds=ago_s)
        return Claim(namespace=tenant, name=name, state=state, spec=spec(1), sequence=2, flavor=flavor,
                     submitted_at=allocated - timedelta(seconds=waited_s), allocated_at=allocated)

    async with api.factory() as s, s.begin():
        s.add_all([admitted("vision", f"v{i}", "H100", waited_s=10.0 * (i + 1), ago_s=60) for i in range(10)])
        s.add(admitted("vision", "done", "H100", waited_s=500.0, ago_s=120, state="Released"))  # released since
        s.add(admitted("vision", "small", "H100-1g.10gb", waited_s=5.0, ago_s=30))
        s.add(admitted("vision", "old", "H100", waited_s=9000.0, ago_s=7200))  # two hours ago
        s.add(admitted("speech", "s0", "A100", waited_s=30.0, ago_s=10))
    body = (await api.client.get("/v1/waiting", headers=api.viewer)).json()
    assert body["window"] == "hour"
    rows = {(r["tenant"], r["flavor"]): r for r in body["admitted"]}
    assert set(rows) == {("vision", "H100"), ("vision", "H100-1g.10gb"), ("speech", "A100")}
    h100 = rows[("vision", "H100")]
    assert (h100["admitted"], h100["p50WaitSeconds"], h100["p90WaitSeconds"], h100["maxWaitSeconds"]) == (
        11, 60.0, 100.0, 500.0)
    day = (await api.client.get("/v1/waiting?window=day", headers=api.viewer)).json()
    assert {(r["tenant"], r["flavor"]): r["admitted"] for r in day["admitted"]}[("vision", "H100")] == 12
    scoped = (await api.client.get("/v1/waiting", headers=api.scoped)).json()
    assert {r["tenant"] for r in scoped["admitted"]} == {"vision"}
    assert (await api.client.get("/v1/waiting?window=year", headers=api.viewer)).status_code == 422

