"""API tokens: only a SHA-256 of each token is stored; the plaintext is shown once, at creation.

A plain hash suffices (no salt, no slow KDF): tokens are 256 random bits, not guessable passwords, and
an unsalted hash is what lets a request find its token with one indexed lookup.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from shared.ledger.schema import ApiToken, AuditEntry

ROLES = ("admin", "viewer")
MAX_TTL_S = 10 * 365 * 86400.0  # ten years: longer is "never", which is no ttl at all
PREFIX = "cb_"


def generate_token() -> str:
    """The prefix makes a leaked token recognisable to secret scanners and to people."""
    return PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_token(
    session_factory: async_sessionmaker[AsyncSession], role: str, tenant: str | None,
    ttl: float | None = None, *, actor: str = "cli",
) -> str:
    """Store a new token's hash and return the plaintext, which is never stored; with `ttl` (seconds) it
    stops working that long after. Audited under `actor`.

    Only viewers may be scoped to a tenant: a tenant-scoped admin would suggest a write limit that the
    API does not enforce.
    """
    async with session_factory() as session, session.begin():
        token, _ = await add_token(session, role, tenant, ttl, actor=actor)
    return token


async def add_token(session: AsyncSession, role: str, tenant: str | None, ttl: float | None, *,
                    actor: str) -> tuple[str, ApiToken]:
    """A new token's row and its audit entry, in the caller's transaction; the plaintext and the row."""
    token, row = issue_token(role, tenant, ttl)
    session.add(row)
    await session.flush()
    session.add(AuditEntry(actor=actor, action="put", entity=f"token/{row.id}", before=None, after=token_json(row)))
    return token, row


def issue_token(role: str, tenant: str | None, ttl: float | None = None) -> tuple[str, ApiToken]:
    """A new token and its row, not yet added to a session."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if tenant is not None and role != "viewer":
        raise ValueError("only a viewer token can be limited to a tenant")
    if ttl is not None and not 0 < ttl <= MAX_TTL_S:
        raise ValueError(f"a token's ttl must be positive and at most ten years ({MAX_TTL_S:.0f}s)")
    token = generate_token()
    now = datetime.now(UTC)
    row = ApiToken(token_hash=hash_token(token), role=role, tenant=tenant, created_at=now,
                   expires_at=now + timedelta(seconds=ttl) if ttl is not None else None)
    return token, row


def token_json(row: ApiToken) -> dict[str, Any]:
    """What a token is, never what it says: for listings and the audit log."""
    return {"id": row.id, "role": row.role, "tenant": row.tenant, "createdAt": _iso(row.created_at),
            "expiresAt": _iso(row.expires_at), "revokedAt": _iso(row.revoked_at)}


def usable(row: ApiToken, now: datetime | None = None) -> bool:
    now = now or datetime.now(UTC)
    return row.revoked_at is None and (row.expires_at is None or _aware(row.expires_at) > now)


async def lookup_token(session: AsyncSession, token: str) -> ApiToken | None:
    """The token's row if it is known, not revoked and not expired."""
    if not token:
        return None
    found: ApiToken | None = await session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
    return found if found is not None and usable(found) else None


async def still_usable(session: AsyncSession, token_id: int) -> bool:
    """Whether the token of this id is neither revoked nor expired (nor gone): what a long-lived request
    checks now and then."""
    row = await session.get(ApiToken, token_id)
    return row is not None and usable(row)


async def list_tokens(session: AsyncSession) -> list[ApiToken]:
    return list(await session.scalars(select(ApiToken).order_by(ApiToken.id)))


async def revoke_token(session: AsyncSession, token_id: int, actor: str) -> ApiToken | None:
    """Revoked at once (every request looks its token up); the row stays, for the audit log."""
    row = await session.get(ApiToken, token_id)
    if row is None:
        return None
    if row.revoked_at is None:
        before = token_json(row)
        row.revoked_at = datetime.now(UTC)
        session.add(AuditEntry(actor=actor, action="delete", entity=f"token/{row.id}", before=before,
                               after=token_json(row)))
    return row


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)  # SQLite keeps no zone


def _iso(moment: datetime | None) -> str | None:
    return _aware(moment).isoformat().replace("+00:00", "Z") if moment is not None else None
