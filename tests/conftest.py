"""Real parts for tests: a nats-server per test with its own store, a fresh database per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.bus.embedded import EmbeddedNats
from tests.private_postgres import PrivatePostgres

PG_ADMIN_URL = os.environ.get("CLAIMBROKER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    yield server
    server.stop()


async def _admin_execute(statement: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(PG_ADMIN_URL.replace("postgresql://", "postgres://", 1))
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A database of its own on the local PostgreSQL; in CI an unreachable server fails, never skips."""
    name = f"cb_test_{uuid.uuid4().hex[:12]}"
    try:
        await _admin_execute(f'CREATE DATABASE "{name}"')
    except OSError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {error}")
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    await _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test once on the embedded default and once on the production store."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A cluster of the test's own that can be stopped and started: in CI a machine that cannot run one
    fails, never skips."""
    why = PrivatePostgres.unavailable()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"cannot start a private PostgreSQL cluster: {why}")
        pytest.skip(why)
    cluster = PrivatePostgres()
    cluster.start()
    yield cluster
    cluster.destroy()
