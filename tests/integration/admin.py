"""The admin API in process over a fresh ledger, with an admin, a viewer and a viewer limited to tenant
`vision`: what the admin API's tests share (the `api` fixture is in conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.admin_api.app import create_app
from shared.dra.inventory import Fleet
from shared.ledger.engine import create_engine, migrate, sessions
from shared.ledger.schema import ApiToken, AuditEntry, Cohort, Tenant
from shared.ledger.tokens import create_token, hash_token

PROBLEM = "application/problem+json"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """An error as the API gives every one: application/problem+json with exactly its four fields."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert set(body) == {"type", "title", "status", "detail"} and body["status"] == status
    return body


@dataclass
class Api:
    client: httpx.AsyncClient
    factory: async_sessionmaker[AsyncSession]
    admin: dict[str, str]
    viewer: dict[str, str]
    scoped: dict[str, str]  # a viewer limited to tenant "vision"
    admin_id: int

    async def audit(self) -> list[AuditEntry]:
        """The audit log, without the fixture's own token entries."""
        async with self.factory() as s:
            return list(await s.scalars(select(AuditEntry).where(AuditEntry.entity.not_like("token/%"))
                                        .order_by(AuditEntry.id)))

    async def put(self, path: str, body: Any = None) -> httpx.Response:
        return await self.client.put(path, json=body if body is not None else {}, headers=self.admin)

    async def rows(self) -> tuple[int, int, int]:
        """Tenants, cohorts and audit entries: a refused write leaves all three as they were."""
        async with self.factory() as s:
            return (await s.scalar(select(func.count()).select_from(Tenant)) or 0,
                    await s.scalar(select(func.count()).select_from(Cohort)) or 0,
                    await s.scalar(select(func.count()).select_from(AuditEntry)) or 0)


@asynccontextmanager
async def admin_api(db_url: str) -> AsyncIterator[Api]:
    await migrate(db_url)
    engine = create_engine(db_url)
    factory = sessions(engine)
    admin = await create_token(factory, "admin", None)
    viewer = await create_token(factory, "viewer", None)
    scoped = await create_token(factory, "viewer", "vision")
    async with factory() as s:
        admin_id = await s.scalar(select(ApiToken.id).where(ApiToken.token_hash == hash_token(admin)))
    assert admin_id is not None
    async def no_nodes() -> Fleet:  # what-if answers on an empty fleet here
        return Fleet()

    transport = httpx.ASGITransport(app=create_app(engine, fleet=no_nodes))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            yield Api(client, factory, bearer(admin), bearer(viewer), bearer(scoped), admin_id)
    finally:
        await engine.dispose()
