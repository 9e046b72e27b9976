"""Alembic upgrade, downgrade and upgrade again on SQLite and PostgreSQL; the schema matches the models."""

from __future__ import annotations

from sqlalchemy import inspect

from shared.ledger.engine import create_engine, downgrade, migrate
from shared.ledger.schema import Base


async def tables(url: str) -> set[str]:
    engine = create_engine(url)
    async with engine.connect() as connection:
        names = await connection.run_sync(lambda c: set(inspect(c).get_table_names()))
    await engine.dispose()
    return names - {"alembic_version"}


async def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    await migrate(db_url)
    assert await tables(db_url) == set(Base.metadata.tables)
    await downgrade(db_url, "base")
    assert await tables(db_url) == set()
    await migrate(db_url)
    assert await tables(db_url) == set(Base.metadata.tables)
