"""What the usage page's summary strip and filters read, on SQLite and PostgreSQL: /v1/alerts/counts counts
open alerts per kind, severity, tenant and flavor (a tenant-scoped viewer its own), and /v1/waiting says
of each group what kind of wait it is and which flavors its claims would take."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.alerts.book import Alert, Message
from shared.ledger import alerts as alert_history
from shared.ledger.schema import Claim
from tests.integration.admin import Api

T0 = 1_800_000_000.0


def message(kind: str, severity: str, labels: dict[str, str], at: float, *, resolved: bool = False) -> Message:
    key = ":".join([kind, *labels.values()])
    return Message(Alert(kind, severity, key, f"{key} summary", {}, labels), at, at + 5, 1, resolved)


async def test_open_alerts_counted_by_kind_severity_tenant_and_flavor(api: Api) -> None:
    async with api.factory() as s, s.begin():
        await alert_history.record(s, [
            *(message("claim-pending-too-long", "warning", {"tenant": "vision", "claim": f"c{i}"}, T0 + i)
              for i in range(5)),
            message("claim-pending-too-long", "warning", {"tenant": "speech", "claim": "s"}, T0),
            message("claim-pending-too-long", "warning", {"tenant": "vision", "claim": "gone"}, T0, resolved=True),
            message("quota-near-limit", "warning", {"tenant": "vision", "flavor": "H100"}, T0 + 50),
            message("quota-near-limit", "warning", {"tenant": "vision", "flavor": "A100"}, T0 + 60),
            message("device-unhealthy", "critical", {"node": "n1", "device": "gpu-0"}, T0 + 70),
            message("device-unhealthy", "critical", {"node": "n1", "device": "gpu-1"}, T0 + 80),
        ])
    body = (await api.client.get("/v1/alerts/counts", headers=api.viewer)).json()
    assert [(r["kind"], r["severity"], r["tenant"], r["flavor"], r["open"]) for r in body] == [
        ("claim-pending-too-long", "warning", "speech", None, 1),
        ("claim-pending-too-long", "warning", "vision", None, 5),  # the resolved one is not counted
        ("device-unhealthy", "critical", None, None, 2),
        ("quota-near-limit", "warning", "vision", "A100", 1),
        ("quota-near-limit", "warning", "vision", "H100", 1)]
    assert body[2]["lastSeen"] == "2027-01-15T08:01:25Z"  # the newer of the two, as it was last seen
    # a scoped viewer (of vision): its tenant's only, never the fleet's, as /v1/alerts lists them
    scoped = (await api.client.get("/v1/alerts/counts", headers=api.scoped)).json()
    assert {(r["kind"], r["tenant"]) for r in scoped} == {("claim-pending-too-long", "vision"),
                                                          ("quota-near-limit", "vision")}
    listed = (await api.client.get("/v1/alerts?resolved=false", headers=api.scoped)).json()
    assert sum(r["open"] for r in scoped) == len(listed) == 7
    assert (await api.client.get("/v1/alerts/counts")).status_code == 401


def spec(count: int) -> dict[str, object]:
    return {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                         "count": count}}]}}}


def explained(flavors: list[str], **parts: Any) -> dict[str, Any]:
    return {"state": "Pending", "unsatisfiable": False, "flavors": flavors, "quota": [], **parts}


@pytest.mark.parametrize(("reason", "explain", "kind"), [
    ("Quota: H100 of vision", explained(["H100"], quota=[{"flavor": "H100"}]), "quota"),
    ("Insufficient nvidia.com/gpu", explained(["H100"]), "devices"),
    ("no device matches", explained([], unsatisfiable=True), "unsatisfiable"),
    ("placement ran out of budget", explained(["H100"], budgetExceeded=True), "budget"),
    (None, None, "undecided"),
    ("decided before explanations", None, "unexplained"),
])
async def test_a_waiting_group_says_its_kind(api: Api, reason: str | None, explain: dict[str, Any] | None,
                                             kind: str) -> None:
    async with api.factory() as s, s.begin():
        s.add(Claim(namespace="vision", name="c", state="Pending", spec=spec(1), sequence=1, reason=reason,
                    explain=explain))
    [group] = (await api.client.get("/v1/waiting", headers=api.viewer)).json()["groups"]
    assert group["kind"] == kind


async def test_a_waiting_group_names_the_flavors_its_claims_accept(api: Api) -> None:
    now = datetime.now(UTC)
    reason = "Insufficient nvidia.com/gpu: requested 2, free 0 of 8 on 1 node"
    async with api.factory() as s, s.begin():
        s.add_all([
            Claim(namespace="vision", name="a", state="Pending", spec=spec(2), sequence=1, reason=reason,
                  explain=explained(["H100", "H200"]), submitted_at=now - timedelta(seconds=30)),
            Claim(namespace="vision", name="b", state="Pending", spec=spec(2), sequence=1, reason=reason,
                  explain=explained(["A100", "H100"]), submitted_at=now - timedelta(seconds=20)),
            Claim(namespace="vision", name="new", state="Pending", spec=spec(1), sequence=1, reason=None,
                  submitted_at=now),
        ])
    groups = {g["reason"]: g for g in (await api.client.get("/v1/waiting", headers=api.viewer)).json()["groups"]}
    assert groups[reason]["flavors"] == ["A100", "H100", "H200"] and groups[reason]["kind"] == "devices"
    assert groups["not decided yet"]["flavors"] == [] and groups["not decided yet"]["kind"] == "undecided"
