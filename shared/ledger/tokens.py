"""API tokens: only a SHA-256 of each token is stored; the plaintext is shown once, at creation."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.ledger.schema import ApiToken

ROLES = ("admin", "viewer")


def generate_token() -> str:
    return "cb_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_token(session_factory: Any, role: str, tenant: str | None) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    token = generate_token()
    async with session_factory() as session, session.begin():
        session.add(ApiToken(token_hash=hash_token(token), role=role, tenant=tenant))
    return token


async def lookup_token(session: AsyncSession, token: str) -> ApiToken | None:
    found: ApiToken | None = await session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
    return found
