"""Migration 0011 on SQLite and PostgreSQL, with the rows an older broker left: inbox ids written with the
old key keep counting (for every kind and tenant) until pruned, the Released rows that releases of unknown
claims left become expiring records, and a downgrade gives the older version what it reads."""

from __future__ import annotations

from sqlalchemy import text

from shared.ledger.engine import create_engine, downgrade, migrate


async def _rows(url: str, query: str) -> list[tuple[object, ...]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            return [tuple(row) for row in await connection.execute(text(query))]
    finally:
        await engine.dispose()


async def _execute(url: str, *statements: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            for statement in statements:
                await connection.execute(text(statement))
    finally:
        await engine.dispose()


async def test_old_rows_survive_the_upgrade_and_the_downgrade(db_url: str) -> None:
    await migrate(db_url, "0010")
    await _execute(
        db_url,
        "INSERT INTO inbox (consumer, message_id) VALUES ('allocator', 'old-id'), ('notifier', 'status:7')",
        # a release of a name never submitted, as 0010's allocator wrote it, and a claim that really ended
        "INSERT INTO claims (namespace, name, state, spec, priority, preemptible, sequence, released_seq) VALUES "
        "('t', 'never-submitted', 'Released', '{}', 0, true, 0, 42), "
        "('t', 'ran', 'Released', '{}', 0, true, 3, 40)")
    await migrate(db_url)
    assert sorted(await _rows(db_url, "SELECT consumer, message_id, kind, tenant FROM inbox")) == [
        ("allocator", "old-id", "", ""), ("notifier", "status:7", "", "")]
    assert await _rows(db_url, "SELECT name FROM claims") == [("ran",)]
    assert await _rows(db_url, "SELECT tenant, name, released_seq FROM early_releases") == [
        ("t", "never-submitted", 42)]

    # the same id under two kinds and two tenants: one row each now, one row for the older key
    await _execute(db_url, "INSERT INTO inbox (consumer, message_id, kind, tenant, processed_at) VALUES "
                           "('allocator', 'x', 'submit', 'a', CURRENT_TIMESTAMP), "
                           "('allocator', 'x', 'submit', 'b', CURRENT_TIMESTAMP), "
                           "('allocator', 'x', 'release', 'a', CURRENT_TIMESTAMP)")
    await downgrade(db_url, "0010")
    assert sorted(await _rows(db_url, "SELECT consumer, message_id FROM inbox")) == [
        ("allocator", "old-id"), ("allocator", "x"), ("notifier", "status:7")]
    assert sorted(await _rows(db_url, "SELECT name, state, sequence, released_seq FROM claims")) == [
        ("never-submitted", "Released", 0, 42), ("ran", "Released", 3, 40)]
    await migrate(db_url)
    assert await _rows(db_url, "SELECT name FROM early_releases") == [("never-submitted",)]
