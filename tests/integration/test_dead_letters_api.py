"""GET /v1/dead-letters: what the allocator set aside, for admins only, on SQLite and PostgreSQL."""

from __future__ import annotations

import httpx

from services.admin_api.app import create_app
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import DeadLetter
from shared.ledger.tokens import create_token


async def test_dead_letters_are_shown_to_admins_newest_first(ledger_url: str) -> None:
    await migrate(ledger_url)
    engine = create_engine(ledger_url)
    factory = sessions(engine)
    admin, viewer = [await create_token(factory, role, None) for role in ("admin", "viewer")]
    async with factory() as s, s.begin():
        for number, payload in enumerate((b'{"kind": "ResourceClaim"}', b"\xff\x00 not utf-8")):
            s.add(DeadLetter(consumer="allocator", message_id=f"m{number}", subject="claimbroker.v1.claims.submit.t",
                             payload=payload, payload_size=len(payload), error="DataError: value too long",
                             deliveries=number + 1))
    transport = httpx.ASGITransport(app=create_app(engine))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            shown = await client.get("/v1/dead-letters", headers={"Authorization": f"Bearer {admin}"})
            refused = await client.get("/v1/dead-letters", headers={"Authorization": f"Bearer {viewer}"})
    finally:
        await engine.dispose()
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert [(d["messageId"], d["deliveries"], d["payloadSize"]) for d in body] == [("m1", 2, 12), ("m0", 1, 25)]
    assert body[0]["payloadPreview"] == "\ufffd\x00 not utf-8" and body[0]["error"] == "DataError: value too long"
    assert refused.status_code == 403
