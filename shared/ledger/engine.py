"""Async engines for SQLite (embedded default) and PostgreSQL, with the transaction semantics we need.

SQLite: pysqlite sends no BEGIN before a SELECT, so read-then-write would lose updates; we take
control of transactions and start every one with BEGIN IMMEDIATE, which serialises writers.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def normalise_url(url: str) -> str:
    """Accept plain postgresql:// and sqlite:// URLs and pick the async drivers."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    if url.startswith("sqlite://") and not url.startswith("sqlite+"):
        return "sqlite+aiosqlite://" + url.split("://", 1)[1]
    return url


PG_CONNECT_TIMEOUT_S = 10


def _to_json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except (orjson.JSONEncodeError, TypeError):  # an integer beyond 64 bits, which a claim may hold
        return json.dumps(value)


# JSON columns (claim specs, allocations, explanations, outbox payloads) through orjson: the standard
# library's encoder and decoder took a tenth of the allocator's time under a burst.
_JSON = {"json_serializer": _to_json, "json_deserializer": orjson.loads}


# Statements whose text varies with a list's length (`IN (...)` of a batch's keys) are prepared once per
# length: asyncpg's default cache of 100 kept re-preparing them under load, a round trip each.
PG_STATEMENT_CACHE = 1000


def create_engine(url: str, *, pre_ping: bool = True) -> AsyncEngine:
    """`pre_ping`: each checkout first tests its PostgreSQL connection (a round trip). The allocator goes
    without: a connection that broke fails its transaction, which the allocator retries on a fresh one, as
    it retries any ledger error."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30}, **_JSON)

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000", "foreign_keys=ON"):
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _begin(connection: Any) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    # asyncpg waits 60 s for a connection by default: a command or a start-up would hang that long on a
    # server that does not answer; 10 s is plenty on a network that works
    return create_async_engine(url, pool_pre_ping=pre_ping, connect_args={
        "timeout": PG_CONNECT_TIMEOUT_S, "prepared_statement_cache_size": PG_STATEMENT_CACHE}, **_JSON)


def sessions(engine: AsyncEngine) -> async_sessionmaker[Any]:
    return async_sessionmaker(engine, expire_on_commit=False)


def _alembic(url: str, action: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    getattr(command, action)(config, revision)


async def migrate(url: str, revision: str = "head") -> None:
    """Alembic's async env.py calls asyncio.run, so it must run off the event loop's thread."""
    await asyncio.to_thread(_alembic, url, "upgrade", revision)


async def downgrade(url: str, revision: str = "base") -> None:
    await asyncio.to_thread(_alembic, url, "downgrade", revision)


class LedgerNotReady(RuntimeError):
    """The ledger a command needs is missing or behind the code's schema: only up, serve and migrate
    create or migrate one."""


def head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def require_sqlite_file(url: str) -> None:
    """Raise LedgerNotReady for a SQLite ledger whose file does not exist: no wait brings it, unlike a
    PostgreSQL that is restarting."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:" and not Path(path).exists():
            raise LedgerNotReady(f"no ledger at {path}: run `claimbroker up` or `claimbroker migrate` first, or "
                                 "pass the --data-dir or --db of an existing one")


async def require_current(url: str) -> None:
    """Raise LedgerNotReady, naming what to run, unless the ledger exists at the newest schema. A
    missing SQLite file is not created, as connecting to it would."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    url = normalise_url(url)
    require_sqlite_file(url)
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            try:
                current = (await connection.execute(text("SELECT version_num FROM alembic_version"))).scalar()
            except DBAPIError:
                current = None
    except (OSError, DBAPIError) as error:
        raise LedgerNotReady(f"cannot reach the ledger at {engine.url.render_as_string(hide_password=True)}: "
                             f"{error}") from None
    finally:
        await engine.dispose()
    if current != head_revision():
        raise LedgerNotReady(f"the ledger at {engine.url.render_as_string(hide_password=True)} is at schema "
                             f"{current or 'none'}, not {head_revision()}: run `claimbroker migrate` first")

