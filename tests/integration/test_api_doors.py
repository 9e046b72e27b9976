"""Every door of the admin API: each route of /openapi.json x each method x {no token, a garbage token, a
viewer, a viewer limited to another tenant, an admin}. 401 without a valid token, 403 for a viewer that
writes or reads what only admins read, 404 for a limited viewer asking for another tenant's things, and a
limited viewer's lists carry nothing of the other tenant."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest

from services.admin_api.app import create_app
from shared.dra.inventory import Fleet
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import AlertRecord, Claim
from shared.ledger.tokens import create_token

PUBLIC = {"/healthz", "/readyz"}
ADMIN_READS = {"/v1/audit", "/v1/dead-letters", "/v1/tokens", "/v1/credentials"}
VALUES = {"name": "vision", "namespace": "vision", "flavor": "H100"}  # the other tenant's, for the limited viewer
NAMED = {"/v1/cohorts/{name}": "research", "/v1/flavors/{name}": "custom"}
BODIES = {
    "/v1/flavors/{name}": {"selector": "true"},
    "/v1/tenants/{name}/quotas/{flavor}": {"nominal": 1},
    "/v1/quotas/import": {"kind": "Quotas", "tenants": [{"name": "vision"}]},
    "/v1/tokens": {"role": "viewer"},
    "/v1/credentials": {"tenant": "vision"},
    "/v1/whatif": {"removeTenants": ["vision"]},
    "/v1/fair-sharing": {"halfLife": 0},
}
OTHER = "vision"  # the tenant the limited viewer (of "speech") must not see
# Endless event streams: this app has no bus, so a caller let in gets 503 (tests/e2e/test_live_feed.py reads one)
NO_BUS = {"/v1/events"}


@dataclass
class Doors:
    client: httpx.AsyncClient
    callers: dict[str, dict[str, str]]
    spare_token: int  # one the admin may revoke


@pytest.fixture
async def doors(db_url: str) -> AsyncIterator[Doors]:
    await migrate(db_url)
    engine = create_engine(db_url)
    factory = sessions(engine)
    tokens = {"viewer": await create_token(factory, "viewer", None),
              "limited": await create_token(factory, "viewer", "speech"),
              "admin": await create_token(factory, "admin", None)}
    await create_token(factory, "viewer", None)  # the spare, id 4
    async def no_nodes() -> Fleet:
        return Fleet()

    transport = httpx.ASGITransport(app=create_app(engine, fleet=no_nodes))
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        admin = {"Authorization": f"Bearer {tokens['admin']}"}
        for path, body in (("/v1/tenants/vision", {"cohort": "research"}), ("/v1/tenants/speech", {}),
                           ("/v1/flavors/custom", {"selector": "true"}),
                           ("/v1/tenants/vision/quotas/H100", {"nominal": 2})):
            assert (await client.put(path, json=body, headers=admin)).status_code == 200
        async with factory() as s, s.begin():
            s.add(Claim(namespace="vision", name="train", state="Allocated", spec={}, sequence=1,
                        allocation={"devices": {"results": []}}))
            s.add(Claim(namespace="speech", name="asr", state="Pending", spec={}, sequence=1, reason="waiting"))
            now = datetime.now(UTC)
            s.add(AlertRecord(key="claim-rejected:vision/typo", kind="claim-rejected", severity="warning",
                              tenant="vision", summary="claim vision/typo was rejected", details={},
                              labels={"tenant": "vision"}, first_seen=now, last_seen=now))
        callers = {"none": {}, "garbage": {"Authorization": "Bearer cb_garbage"},
                   **{who: {"Authorization": f"Bearer {token}"} for who, token in tokens.items()}}
        yield Doors(client, callers, spare_token=4)
    await engine.dispose()


def concrete(template: str, spare: int) -> str:
    """The template with the other tenant's names: its tenant, its claim (train), the cohort and flavor."""
    path = template.replace("{token_id}", str(spare)).replace("{credential_id}", "1")
    if "{namespace}" in template:
        path = path.replace("{name}", "train")
    path = path.replace("{name}", NAMED.get(template, "{name}"))
    return re.sub(r"\{(\w+)\}", lambda m: VALUES[m[1]], path)


def expected(caller: str, method: str, template: str) -> set[int] | None:
    """The statuses allowed; None: any answer that is no refusal (the admin's)."""
    if template in PUBLIC:
        return {200}
    if caller in ("none", "garbage"):
        return {401}
    if template in NO_BUS:
        return {503}
    if caller == "admin":
        return None
    if method != "get" or template in ADMIN_READS:
        return {403}
    if caller == "limited" and "{" in template and template != "/v1/flavors/{name}":
        return {404}  # the other tenant's (research is vision's cohort): as if it did not exist
    return {200}


async def test_every_route_answers_each_caller_as_it_should(doors: Doors) -> None:
    spec = (await doors.client.get("/openapi.json")).json()
    routes = [(template, method) for template, operations in spec["paths"].items() for method in operations]
    assert len(routes) >= 28 and ("/v1/tokens", "post") in routes and ("/v1/credentials", "post") in routes
    wrong = []
    for caller in ("none", "garbage", "viewer", "limited", "admin"):  # the admin last: it changes things
        for template, method in routes:
            path = concrete(template, doors.spare_token)
            body = BODIES.get(template, {}) if method in ("put", "post") else None
            response = await doors.client.request(method.upper(), path, json=body, headers=doors.callers[caller])
            allowed = expected(caller, method, template)
            if allowed is None:
                if response.status_code in (401, 403) or response.status_code >= 500:
                    wrong.append(f"{caller} {method.upper()} {path}: {response.status_code} {response.text[:120]}")
            elif response.status_code not in allowed:
                wrong.append(f"{caller} {method.upper()} {path}: {response.status_code}, expected {allowed}")
            elif caller == "limited" and response.status_code == 200 and OTHER in response.text:
                wrong.append(f"limited {method.upper()} {path} shows the other tenant: {response.text[:160]}")
    assert wrong == [], "\n".join(wrong)


async def test_a_revoked_or_expired_token_is_refused_at_its_next_request(doors: Doors) -> None:
    admin = doors.callers["admin"]
    made = await doors.client.post("/v1/tokens", json={"role": "viewer", "tenant": "speech"}, headers=admin)
    assert made.status_code == 201
    token, token_id = made.json()["token"], made.json()["id"]
    assert made.json()["tenant"] == "speech" and made.json()["expiresAt"] is None
    mine = {"Authorization": f"Bearer {token}"}
    assert (await doors.client.get("/v1/claims", headers=mine)).status_code == 200
    listed = (await doors.client.get("/v1/tokens", headers=admin)).json()
    assert [t["id"] for t in listed] == [1, 2, 3, 4, token_id] and all("token" not in t for t in listed)
    assert (await doors.client.delete(f"/v1/tokens/{token_id}", headers=admin)).status_code == 204
    assert (await doors.client.get("/v1/claims", headers=mine)).status_code == 401
    assert (await doors.client.delete("/v1/tokens/999", headers=admin)).status_code == 404

    short = await doors.client.post("/v1/tokens", json={"role": "viewer", "ttl": 0.001}, headers=admin)
    assert short.json()["expiresAt"] is not None
    assert (await doors.client.get("/v1/claims", headers={"Authorization": f"Bearer {short.json()['token']}"})
            ).status_code == 401  # a millisecond is over by the time it is used
    refused = await doors.client.post("/v1/tokens", json={"role": "admin", "tenant": "speech"}, headers=admin)
    assert refused.status_code == 422
    audit = (await doors.client.get("/v1/audit", params={"entity": "token/"}, headers=admin)).json()
    assert (audit[0]["action"], audit[0]["entity"]) == ("put", f"token/{short.json()['id']}")
    assert (audit[1]["action"], audit[1]["entity"]) == ("delete", f"token/{token_id}")
    assert audit[1]["after"]["revokedAt"] is not None and "token" not in audit[1]["after"]
