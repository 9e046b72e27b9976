"""Usage samples and GET /v1/usage/history: a minute's sample is written once, points average their bucket's
samples (used within nominal, borrowed, idle), gaps are null, old samples are pruned, and a tenant-scoped
viewer gets its own tenant's series only."""

from __future__ import annotations

import time

from sqlalchemy import func, select

from shared.ledger import usage_history
from shared.ledger.schema import UsageSample
from tests.integration.admin import Api, assert_problem

CAPACITY = {"H100": 16, "A100": 8}


async def sample(api: Api, at: float, vision: int, speech: int) -> bool:
    """vision holds `vision` H100s of a nominal 4, speech `speech` H100s of a nominal 8 and one A100."""
    async with api.factory() as s, s.begin():
        return await usage_history.record(s, at, {("vision", "H100"): vision, ("speech", "H100"): speech,
                                                  ("speech", "A100"): 1},
                                          {("vision", "H100"): 4, ("speech", "H100"): 8}, CAPACITY)


async def test_samples_averaged_into_the_window_s_points(api: Api) -> None:
    now = time.time()
    minute = int(now) // 60 * 60
    assert await sample(api, minute - 120 + 5, vision=6, speech=2)  # two minutes ago: vision borrows 2
    assert not await sample(api, minute - 120 + 30, vision=9, speech=9), "a minute is sampled once"
    assert await sample(api, minute + 1, vision=2, speech=10)  # now: speech borrows 2

    body = (await api.client.get("/v1/usage/history", headers=api.viewer)).json()
    assert (body["window"], body["bucketSeconds"], body["tenant"]) == ("hour", 60, None)
    series = {f["flavor"]: f["points"] for f in body["flavors"]}
    assert {f["flavor"]: f["unitsPerDevice"] for f in body["flavors"]} == {"A100": 1.0, "H100": 2.0}
    assert set(series) == {"A100", "H100"} and all(len(points) == 60 for points in series.values())
    by_time = {p["at"]: p for p in series["H100"]}
    assert by_time[minute - 120] == {"at": minute - 120, "used": 6.0, "borrowed": 2.0, "idle": 8.0, "nominal": None}
    assert by_time[minute] == {"at": minute, "used": 10.0, "borrowed": 2.0, "idle": 4.0, "nominal": None}
    assert by_time[minute - 60]["used"] is None, "no sample that minute: a gap, not a zero"
    # speech's A100 has no quota: all of it is borrowed
    assert {p["at"]: (p["used"], p["borrowed"], p["idle"]) for p in series["A100"]}[minute] == (0.0, 1.0, 7.0)

    day = (await api.client.get("/v1/usage/history?window=day", headers=api.viewer)).json()
    assert day["bucketSeconds"] == 900 and len(day["flavors"][0]["points"]) == 96
    # a 15-minute bucket holding both samples (unless they straddle a boundary) averages them
    h100 = [p for p in {f["flavor"]: f["points"] for f in day["flavors"]}["H100"] if p["used"] is not None]
    assert sum(1 for _ in h100) in (1, 2)
    if len(h100) == 1:
        assert (h100[0]["used"], h100[0]["borrowed"], h100[0]["idle"]) == (8.0, 2.0, 6.0)

    mine = (await api.client.get("/v1/usage/history?tenant=speech", headers=api.viewer)).json()
    assert mine["tenant"] == "speech"
    speech = {p["at"]: p for p in {f["flavor"]: f["points"] for f in mine["flavors"]}["H100"]}
    assert speech[minute] == {"at": minute, "used": 8.0, "borrowed": 2.0, "idle": None, "nominal": 8.0}

    scoped = (await api.client.get("/v1/usage/history", headers=api.scoped)).json()
    assert scoped["tenant"] == "vision" and [f["flavor"] for f in scoped["flavors"]] == ["H100"]
    assert "speech" not in str(scoped)
    assert_problem(await api.client.get("/v1/usage/history?tenant=speech", headers=api.scoped), 404)
    assert_problem(await api.client.get("/v1/usage/history?window=year", headers=api.viewer), 422)
    assert (await api.client.get("/v1/usage/history")).status_code == 401


async def test_samples_past_retention_are_pruned(api: Api) -> None:
    now = time.time()
    assert await sample(api, now - usage_history.RETENTION_S - 120, vision=1, speech=1)
    assert await sample(api, now - 3600, vision=1, speech=1)
    assert await sample(api, now, vision=1, speech=1)
    async with api.factory() as s:
        kept = set(await s.scalars(select(func.distinct(UsageSample.at))))
    assert kept == {int(now - 3600) // 60 * 60, int(now) // 60 * 60}
