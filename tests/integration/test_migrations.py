"""Alembic upgrade, downgrade and upgrade again on SQLite and PostgreSQL; the schema matches the models."""

from __future__ import annotations

from sqlalchemy import inspect, text

from shared.ledger.engine import create_engine, downgrade, migrate
from shared.ledger.schema import Base


async def columns(url: str) -> dict[str, set[str]]:
    """Each table's columns, as the database has them."""
    engine = create_engine(url)
    async with engine.connect() as connection:
        found = await connection.run_sync(lambda c: {
            table: {column["name"] for column in inspect(c).get_columns(table)}
            for table in inspect(c).get_table_names()})
    await engine.dispose()
    found.pop("alembic_version", None)
    return found


async def tables(url: str) -> set[str]:
    return set(await columns(url))


MODELS = {name: {column.name for column in table.columns} for name, table in Base.metadata.tables.items()}


async def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    await migrate(db_url)
    assert await columns(db_url) == MODELS
    await downgrade(db_url, "base")
    assert await tables(db_url) == set()
    await migrate(db_url)
    assert await columns(db_url) == MODELS


async def _execute(url: str, *statements: str) -> list[tuple[object, ...]]:
    """The statements in one transaction; the last one's rows, if it returns any."""
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            result = None
            for statement in statements:
                result = await connection.execute(text(statement))
            return [tuple(row) for row in result] if result is not None and result.returns_rows else []
    finally:
        await engine.dispose()


async def test_0012_adds_gang_reserve_after_and_gang_waits_and_takes_them_back(db_url: str) -> None:
    await migrate(db_url, "0011")
    await _execute(db_url, "INSERT INTO tenants (name, weight, pending_alert_after_s) VALUES ('vision', 2, 300)")
    await migrate(db_url)
    assert await _execute(db_url, "SELECT name, pending_alert_after_s, gang_reserve_after_s FROM tenants") == [
        ("vision", 300.0, None)], "a tenant from before has no gangReserveAfter of its own: the broker's"
    await _execute(db_url, "UPDATE tenants SET gang_reserve_after_s = 600",
                   "INSERT INTO gang_waits (tenant, gang, complete_since, first_since) "
                   "VALUES ('vision', 'job', NULL, 5)")
    await downgrade(db_url, "0011")
    found = await columns(db_url)
    assert "gang_waits" not in found and "gang_reserve_after_s" not in found["tenants"]
    assert await _execute(db_url, "SELECT name, pending_alert_after_s FROM tenants") == [("vision", 300.0)]
    await migrate(db_url)
    assert await _execute(db_url, "SELECT gang_reserve_after_s FROM tenants") == [(None,)]
    assert await _execute(db_url, "SELECT tenant FROM gang_waits") == []


async def test_0014_adds_estimate_reason_and_takes_it_back(db_url: str) -> None:
    await migrate(db_url, "0013")
    await _execute(db_url, "INSERT INTO claims (namespace, name, state, spec, priority, preemptible, sequence) "
                           "VALUES ('vision', 'waits', 'Pending', '{}', 0, true, 2)")
    await migrate(db_url)
    assert await _execute(db_url, "SELECT name, estimate_reason FROM claims") == [("waits", None)], (
        "a claim from before: no null estimate known to be published (the estimator publishes it once more)")
    await _execute(db_url, "UPDATE claims SET estimate_reason = 'it does not start within 7d'")
    await downgrade(db_url, "0013")
    assert "estimate_reason" not in (await columns(db_url))["claims"]
    assert await _execute(db_url, "SELECT name, sequence FROM claims") == [("waits", 2)]
    await migrate(db_url)
    assert await _execute(db_url, "SELECT estimate_reason FROM claims") == [(None,)]


async def test_0015_moves_the_config_revision_on_every_write_of_the_quota_configuration(db_url: str) -> None:
    """Whoever writes tenants, quotas, cohorts or flavors (the admin API, quota import, psql), the database
    moves config_revision, which the allocator reads the configuration again by. At head: a later migration
    that rebuilt one of these tables on SQLite without its triggers fails here."""
    await migrate(db_url)

    async def revision() -> int:
        return int((await _execute(db_url, "SELECT revision FROM config_revision WHERE id = 1"))[0][0])

    writes = ["INSERT INTO cohorts (name) VALUES ('org')",
              "INSERT INTO tenants (name, cohort, weight, admin_access) VALUES ('vision', 'org', 1.0, false)",
              "UPDATE tenants SET weight = 2.0 WHERE name = 'vision'",
              "INSERT INTO flavors (name, selector, value, position) VALUES ('h100', 'true', 1.0, 0)",
              "UPDATE flavors SET value = 2.0",
              "INSERT INTO quotas (tenant, flavor, nominal) VALUES ('vision', 'h100', 8)",
              "UPDATE quotas SET nominal = 16",
              "DELETE FROM quotas", "DELETE FROM flavors", "DELETE FROM tenants", "DELETE FROM cohorts"]
    for statement in writes:
        before = await revision()
        await _execute(db_url, statement)
        assert await revision() > before, statement
    before = await revision()
    await _execute(db_url, "UPDATE claims SET sequence = sequence + 1")  # not the configuration
    assert await revision() == before
    await downgrade(db_url, "0014")
    assert "config_revision" not in await tables(db_url)
    await _execute(db_url, "INSERT INTO cohorts (name) VALUES ('after')")  # no trigger left behind
    await migrate(db_url)
    assert await revision() == 0
