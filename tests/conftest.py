"""Real parts for tests: a nats-server per test with its own store, a database of its own per test.

`db_url` and `postgres_url` are empty databases (the migration tests start from nothing); `ledger_url` is
a database already at the newest schema: a SQLite file copied from one migrated once per run, or a
PostgreSQL database made `TEMPLATE` one migrated once per run (or such a database emptied after the test
before it: see _Databases). Migrating each test's database from nothing cost about half a second per
PostgreSQL test, and hundreds of tests only need the result."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from services.bus.embedded import EmbeddedNats
from tests.private_postgres import PrivatePostgres

PG_ADMIN_URL = os.environ.get("CLAIMBROKER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _compile_the_sources_ahead() -> None:
    """With PYTHONDONTWRITEBYTECODE set, no interpreter writes a .pyc: every CLI command, `up` and its
    allocator process the tests start compiled the project's modules from source again (45 ms of CPU a
    `claimbroker status`, 200 ms a process importing the services; alembic compiled the migrations at each
    `migrate` as well). Compiled once here, beside their sources, as Python does without that variable (and
    ignored by git); Python still checks each against its source, so an edited module is never run stale.
    Only what is not up to date is compiled: a few hundredths of a second once done."""
    if not sys.dont_write_bytecode:
        return  # the interpreters write them themselves
    import compileall

    root = Path(__file__).resolve().parent.parent
    for folder in ("services", "shared", "migrations", "bench"):
        with contextlib.suppress(OSError):  # a read-only checkout: only slower
            compileall.compile_dir(root / folder, quiet=2)


_compile_the_sources_ahead()


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


# What makes two databases alike for a test: their schema (tables, columns, defaults, indexes, constraints,
# triggers, functions, schemas) and their Alembic revision.
_SCHEMA = """SELECT md5(concat_ws('|',
  (SELECT string_agg(format('%s.%s:%s:%s:%s', table_name, column_name, data_type, is_nullable,
                            coalesce(column_default, '')), ',' ORDER BY table_name, column_name)
   FROM information_schema.columns WHERE table_schema = 'public'),
  (SELECT string_agg(indexdef, ',' ORDER BY indexname) FROM pg_indexes WHERE schemaname = 'public'),
  (SELECT string_agg(conname::text || pg_get_constraintdef(oid), ',' ORDER BY conname) FROM pg_constraint
   WHERE connamespace = 'public'::regnamespace),
  (SELECT string_agg(relname::text || relkind::text, ',' ORDER BY relname) FROM pg_class
   WHERE relnamespace = 'public'::regnamespace),
  (SELECT string_agg(tgname::text, ',' ORDER BY tgname) FROM pg_trigger WHERE NOT tgisinternal),
  (SELECT string_agg(proname::text, ',' ORDER BY proname) FROM pg_proc WHERE pronamespace = 'public'::regnamespace),
  (SELECT string_agg(nspname::text, ',' ORDER BY nspname) FROM pg_namespace),
  (SELECT string_agg(version_num::text, ',') FROM alembic_version)))"""


class _Databases:
    """The tests' databases, made and dropped in a thread of their own.

    An empty one is made while the test before runs. One at head (from the template) is, after its test,
    emptied for the next (its other sessions ended, every table but alembic_version that was ever written
    truncated, every sequence back at 1) when its schema is still the template's, else dropped: CREATE
    DATABASE copies the catalogs and waits for the disk, a third to half a second on a loaded 2-core machine,
    against a few hundredths for TRUNCATE. Either way a test finds no row, no session and no schema change
    that another left. A commit does not wait for its WAL to reach the disk (synchronous_commit off): what
    every session sees is the same, only a crash of the shared server (which no test causes) could lose the
    last commits of a database dropped anyway.

    Two at head take turns: a test takes one emptied already while the one of the test before is emptied
    behind it (the emptying, 0.1-0.4 s under load here, was waited for by every PostgreSQL test)."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="test-databases")
        self._next: Future[str] | None = None  # an empty one, made ahead
        self._lock = threading.Lock()  # over _emptied and _coming: the thread and the tests' loop change them
        self._emptied: dict[str, list[str]] = {}  # by template: emptied after their tests, for the next
        self._coming: dict[str, int] = {}  # by template: databases being emptied or made for _emptied
        self._schema: dict[str, str] = {}  # by template: the schema of a database just made from it

    @staticmethod
    def _create(template: str | None) -> str:
        name = f"cb_test_{uuid.uuid4().hex[:12]}"

        async def create() -> None:
            await _admin_execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
            await _admin_execute(f'ALTER DATABASE "{name}" SET synchronous_commit TO off')

        asyncio.run(create())
        return name

    @staticmethod
    def _drop(name: str) -> None:
        asyncio.run(_admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    @staticmethod
    async def _connect(name: str) -> Any:
        import asyncpg

        return await asyncpg.connect(_database_url(name).replace("postgresql://", "postgres://", 1))

    def _pop_emptied(self, template: str) -> str | None:
        with self._lock:
            emptied = self._emptied.get(template)
            return emptied.pop() if emptied else None

    def _arrived(self, template: str, name: str | None) -> None:
        """A database being emptied or made for the next tests is ready (`name`) or dropped (None)."""
        with self._lock:
            self._coming[template] -= 1
            if name is not None:
                self._emptied.setdefault(template, []).append(name)

    def _from_template(self, template: str) -> str:
        return self._pop_emptied(template) or self._made_from(template)

    def _made_from(self, template: str) -> str:
        name = self._create(template)
        if template not in self._schema:

            async def schema() -> str:
                connection = await self._connect(name)
                try:
                    return str(await connection.fetchval(_SCHEMA))
                finally:
                    await connection.close()

            try:
                self._schema[template] = asyncio.run(schema())
            except BaseException:
                self._drop(name)
                raise
        return name

    def _empty_or_drop(self, name: str, template: str) -> None:
        async def empty() -> bool:
            import asyncpg

            admin = await asyncpg.connect(PG_ADMIN_URL.replace("postgresql://", "postgres://", 1))
            try:
                await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE datname = $1 AND pid <> pg_backend_pid()", name)
            finally:
                await admin.close()
            connection = await self._connect(name)
            try:
                if await connection.fetchval(_SCHEMA) != self._schema.get(template):
                    return False
                # Only the tables that ever held a row (a table never written has no page; TRUNCATE leaves
                # none): each one truncated costs new files, 15-20 ms on this machine, 0.3-0.4 s for all 19.
                tables = [row[0] for row in await connection.fetch(
                    "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public' "
                    "AND tablename <> 'alembic_version' "
                    "AND pg_relation_size(format('%I.%I', schemaname, tablename)::regclass) > 0")]
                if tables:
                    await connection.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
                sequences = [row[0] for row in await connection.fetch(
                    "SELECT quote_ident(sequencename) FROM pg_sequences WHERE schemaname = 'public'")]
                if sequences:  # one round trip for all
                    await connection.execute("".join(f"ALTER SEQUENCE {sequence} RESTART;" for sequence in sequences))
                return True
            finally:
                await connection.close()

        emptied = False
        with contextlib.suppress(Exception):  # whatever stops it being emptied, it goes
            emptied = asyncio.run(empty())
        if emptied:
            self._arrived(template, name)
        else:
            self._arrived(template, None)
            self._drop(name)

    def _spare(self, template: str) -> None:
        made = None
        with contextlib.suppress(Exception):  # none made: the next test makes its own
            made = self._made_from(template)
        self._arrived(template, made)

    def take(self, template: str | None) -> Future[str]:
        """A database of its own for a test: at head from `template`, or an empty one (the next begun at once)."""
        if template is not None:
            name = self._pop_emptied(template)
            taken: Future[str] = Future()
            if name is None:
                taken = self._thread.submit(self._from_template, template)
            else:
                taken.set_result(name)
            with self._lock:  # none emptied and none coming: one more is made for the next test, in turn
                spare = not self._emptied.get(template) and not self._coming.get(template)
                if spare:
                    self._coming[template] = self._coming.get(template, 0) + 1
            if spare:
                self._thread.submit(self._spare, template)
            return taken
        ready = self._next or self._thread.submit(self._create, None)
        self._next = self._thread.submit(self._create, None)
        return ready

    def give_back(self, name: str, template: str | None) -> None:
        if template is None:
            self._thread.submit(self._drop, name)
        else:
            with self._lock:
                self._coming[template] = self._coming.get(template, 0) + 1
            self._thread.submit(self._empty_or_drop, name, template)

    def forget(self, template: str) -> None:
        """Drop the databases made from `template` and kept, after whatever is under way: it may go next."""

        def drop_all() -> None:
            with self._lock:
                kept = self._emptied.pop(template, [])
            for name in kept:
                self._drop(name)

        self._thread.submit(drop_all).result()

    @classmethod
    def _drop_made(cls, made: Future[str]) -> None:
        with contextlib.suppress(Exception):  # one that could not be made
            cls._drop(made.result())

    def close(self) -> None:
        for template in list(self._emptied):
            self.forget(template)
        if self._next is not None:
            self._thread.submit(self._drop_made, self._next)
        self._thread.shutdown(wait=True)


@pytest.fixture(scope="session")
def test_databases() -> Iterator[_Databases]:
    databases = _Databases()
    yield databases
    databases.close()


async def _own_database(databases: _Databases, template: str | None = None) -> AsyncIterator[str]:
    try:
        name = await asyncio.wrap_future(databases.take(template))
    except OSError as error:
        _unreachable(error)
    try:
        yield _database_url(name)
    finally:
        databases.give_back(name, template)


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
    """An empty database of its own on the local PostgreSQL, created and dropped on the test's loop (not the
    pool of databases made ahead: the short chaos run, which starts and stops processes and a cluster of its
    own, twice hung or failed on its loop's close in the fresh-clone suite with it); in CI an unreachable
    server fails, never skips."""
    name = f"cb_test_{uuid.uuid4().hex[:12]}"
    try:
        await _admin_execute(f'CREATE DATABASE "{name}"')
    except OSError as error:
        _unreachable(error)
    yield _database_url(name)
    await _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test once on the embedded default and once on the production store; empty."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture(scope="session")
def postgres_template(test_databases: _Databases) -> Iterator[str]:
    """The name of a database migrated to head once per run, for `CREATE DATABASE ... TEMPLATE`; dropped at
    the end, after the copy made ahead. Nothing connects to it after the migration (a template must have no
    other session)."""
    name = f"cb_test_template_{uuid.uuid4().hex[:12]}"
    try:
        _off_the_loop(lambda: asyncio.run(_admin_execute(f'CREATE DATABASE "{name}"')))
    except OSError as error:
        _unreachable(error)
    try:
        _off_the_loop(lambda: _migrate_now(_database_url(name)))
        yield name
    finally:
        test_databases.forget(name)
        _off_the_loop(lambda: asyncio.run(_admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite ledger migrated to head once per run, copied for each test (its engine closed: no WAL left)."""
    path = tmp_path_factory.mktemp("ledger-template") / "ledger.db"
    _off_the_loop(lambda: _migrate_now(f"sqlite+aiosqlite:///{path}"))
    assert not path.with_name("ledger.db-wal").exists()
    return path


@pytest.fixture
async def migrated_postgres_url(test_databases: _Databases, postgres_template: str) -> AsyncIterator[str]:
    """A database of its own at the newest schema, as `claimbroker migrate` leaves one."""
    async for url in _own_database(test_databases, template=postgres_template):
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
