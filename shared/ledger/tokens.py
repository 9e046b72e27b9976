"""API tokens: only a SHA-256 of each token is stored; the plaintext is shown once, at creation.

A plain hash suffices (no salt, no slow KDF): tokens are 256 random bits, not guessable passwords, and
an unsalted hash is what lets a request find its token with one indexed lookup.
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from shared.ledger.schema import ApiToken

ROLES = ("admin", "viewer")
PREFIX = "cb_"


def generate_token() -> str:
    """The prefix makes a leaked token recognisable to secret scanners and to people."""
    return PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_token(
    session_factory: async_sessionmaker[AsyncSession], role: str, tenant: str | None
) -> str:
    """Store a new token's hash and return the plaintext, which is never stored.

    Only viewers may be scoped to a tenant: a tenant-scoped admin would suggest a write limit that the
    API does not enforce.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if tenant is not None and role != "viewer":
        raise ValueError("only a viewer token can be limited to a tenant")
    token = generate_token()
    async with session_factory() as session, session.begin():
        session.add(ApiToken(token_hash=hash_token(token), role=role, tenant=tenant))
    return token


async def lookup_token(session: AsyncSession, token: str) -> ApiToken | None:
    if not token:
        return None
    query = select(ApiToken).where(ApiToken.token_hash == hash_token(token))
    found: ApiToken | None = await session.scalar(query)
    return found
