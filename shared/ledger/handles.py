"""The ledger as a service holds it: an engine per process, a factory of sessions, a session per
transaction, the errors of a ledger that does not answer, and its address as it may be shown.

Named here so that services hand these around without importing SQLAlchemy: an import-linter contract
keeps SQLAlchemy inside shared.ledger (and migrations).
"""

from __future__ import annotations

from typing import TypeAlias

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

__all__ = ["AsyncEngine", "AsyncSession", "BadLedgerUrl", "LedgerError", "SessionFactory", "async_sessionmaker",
           "masked_url", "ping"]

SessionFactory: TypeAlias = async_sessionmaker[AsyncSession]
LedgerError = DBAPIError  # what the database driver raised: refused, unreachable, gone mid-transaction
BadLedgerUrl = ArgumentError  # a string that is no database URL


def masked_url(url: str) -> str:
    """The ledger's URL with its password hidden, as logs and messages show it; BadLedgerUrl when `url`
    is none."""
    return make_url(url).render_as_string(hide_password=True)


async def ping(session: AsyncSession) -> None:
    """One round trip: raises if the ledger does not answer."""
    await session.execute(text("SELECT 1"))
