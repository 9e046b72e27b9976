"""Bus credentials in the ledger: created and revoked by quota admins, audited, only a bcrypt hash kept.

bcrypt rather than the API tokens' plain SHA-256: nats-server checks a password against the rendered hash
itself and understands bcrypt only, and no request needs to find a credential by its hash.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import bcrypt
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.contract import bus_auth
from shared.ledger.schema import AuditEntry, BusCredential

BCRYPT_ROUNDS = 10  # what the server pays per connection: a few ms


def hash_password(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(BCRYPT_ROUNDS)).decode()


def new_password() -> str:
    """URL-safe, so it goes into a nats:// URL as it is."""
    return secrets.token_urlsafe(24)


async def add_credential(session: AsyncSession, role: str, tenant: str | None, *,
                         actor: str) -> tuple[str, BusCredential]:
    """A new credential's row and audit entry in the caller's transaction; the password (shown once) and
    the row."""
    if role not in bus_auth.ROLES:
        raise ValueError(f"role must be one of {', '.join(bus_auth.ROLES)}, got {role!r}")
    key = secrets.token_hex(4)
    if role == "tenant":
        if tenant is None:
            raise ValueError("a tenant credential names its tenant")
        user = bus_auth.tenant_user(tenant, key)
    else:  # alerts: every tenant's, or `tenant`'s only
        user = bus_auth.alerts_user(key, tenant)
    password = new_password()
    row = BusCredential(user=user, role=role, tenant=tenant, password_hash=hash_password(password),
                        created_at=datetime.now(UTC))
    session.add(row)
    await session.flush()
    session.add(AuditEntry(actor=actor, action="put", entity=f"credential/{row.id}", before=None,
                           after=credential_json(row)))
    return password, row


async def list_credentials(session: AsyncSession) -> list[BusCredential]:
    return list(await session.scalars(select(BusCredential).order_by(BusCredential.id)))


async def revoke_credential(session: AsyncSession, credential_id: int, actor: str) -> BusCredential | None:
    """Marked revoked (the row stays for the audit log); the server drops it at its next reload."""
    row = await session.get(BusCredential, credential_id)
    if row is None:
        return None
    if row.revoked_at is None:
        before = credential_json(row)
        row.revoked_at = datetime.now(UTC)
        session.add(AuditEntry(actor=actor, action="delete", entity=f"credential/{row.id}", before=before,
                               after=credential_json(row)))
    return row


async def active_users(session: AsyncSession) -> list[bus_auth.BusUser]:
    rows = await session.scalars(select(BusCredential).where(BusCredential.revoked_at.is_(None)))
    return [bus_auth.BusUser(r.user, r.password_hash, r.role, r.tenant) for r in rows]


async def credential_tenants(session: AsyncSession) -> list[str]:
    """Every tenant that ever had a credential, revoked or not: each keeps its account on the bus."""
    rows = await session.scalars(select(BusCredential.tenant).where(BusCredential.tenant.is_not(None)).distinct())
    return sorted(t for t in rows if t is not None)


async def revision(session: AsyncSession) -> tuple[int, int]:
    """Changes when a credential is created or revoked: what a renderer polls."""
    row = (await session.execute(select(func.coalesce(func.max(BusCredential.id), 0),
                                        func.count(BusCredential.revoked_at)))).one()
    return int(row[0]), int(row[1])


def credential_json(row: BusCredential) -> dict[str, Any]:
    """What a credential is, never its password: for listings and the audit log."""
    return {"id": row.id, "user": row.user, "role": row.role, "tenant": row.tenant,
            "createdAt": _iso(row.created_at), "revokedAt": _iso(row.revoked_at)}


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.isoformat().replace("+00:00", "Z")
