"""Real parts for tests: a nats-server per test with its own store, a fresh database per test.

`db_url` and `postgres_url` are empty databases (the migration tests start from nothing); `ledger_url` is
a database already at the newest schema, copied from one migrated once per run (a SQLite file copied, a
PostgreSQL database created `TEMPLATE` it): migrating each test's database from nothing cost about half a
second per PostgreSQL test, and hundreds of tests only need the result."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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


def _database_url(name: str) -> str:
    return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"


def _unreachable(error: OSError) -> None:
    """In CI an unreachable server fails, never skips."""
    if os.environ.get("CI"):
        raise error
    pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {error}")


async def _own_database(template: str | None = None) -> AsyncIterator[str]:
    name = f"cb_test_{uuid.uuid4().hex[:12]}"
    try:
        await _admin_execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    except OSError as error:
        _unreachable(error)
    # A commit does not wait for its WAL to reach the disk: what every session sees is the same, only a crash
    # of the shared server (which no test causes) could lose the last commits of a database dropped anyway.
    await _admin_execute(f'ALTER DATABASE "{name}" SET synchronous_commit TO off')
    yield _database_url(name)
    await _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _off_the_loop(work: Callable[[], object]) -> None:
    """Run `work` (which may call asyncio.run, as Alembic's env.py does) in a thread of its own: asyncio.run
    on the test's thread would unset the loop pytest-asyncio set for it."""
    with ThreadPoolExecutor(1) as thread:
        thread.submit(work).result()


def _migrate_now(url: str) -> None:
    from shared.ledger.engine import migrate

    asyncio.run(migrate(url))


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """An empty database of its own on the local PostgreSQL; in CI an unreachable server fails, never skips."""
    async for url in _own_database():
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test once on the embedded default and once on the production store; empty."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """The name of a database migrated to head once per run, for `CREATE DATABASE ... TEMPLATE`; dropped at
    the end. Nothing connects to it after the migration (a template must have no other session)."""
    name = f"cb_test_template_{uuid.uuid4().hex[:12]}"
    try:
        _off_the_loop(lambda: asyncio.run(_admin_execute(f'CREATE DATABASE "{name}"')))
    except OSError as error:
        _unreachable(error)
    try:
        _off_the_loop(lambda: _migrate_now(_database_url(name)))
        yield name
    finally:
        _off_the_loop(lambda: asyncio.run(_admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite ledger migrated to head once per run, copied for each test (its engine closed: no WAL left)."""
    path = tmp_path_factory.mktemp("ledger-template") / "ledger.db"
    _off_the_loop(lambda: _migrate_now(f"sqlite+aiosqlite:///{path}"))
    assert not path.with_name("ledger.db-wal").exists()
    return path


@pytest.fixture
async def migrated_postgres_url(postgres_template: str) -> AsyncIterator[str]:
    """A database of its own at the newest schema, as `claimbroker migrate` leaves one."""
    async for url in _own_database(template=postgres_template):
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """As `db_url`, but already at the newest schema (`migrate` on it changes nothing)."""
    if request.param == "sqlite":
        path = tmp_path / "ledger.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite+aiosqlite:///{path}"
    return str(request.getfixturevalue("migrated_postgres_url"))


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
