"""config_revision: a counter the database moves whenever the quota configuration changes

Triggers on tenants, quotas, cohorts and flavors bump its one row on every insert, update and delete (and
truncate on PostgreSQL), whoever writes (the admin API, `quota import`, a person with psql): the allocator
reads this counter in each decision transaction and reads the configuration itself only when it moved (four
queries, a twentieth of a transaction under churn, issue 42). SQLite drops a table's triggers when a
migration rebuilds the table (batch mode): such a migration must create them again
(tests/integration/test_migrations.py checks that each table's writes move the counter at head).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 05:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

TABLES = ('tenants', 'quotas', 'cohorts', 'flavors')
BUMP = 'UPDATE config_revision SET revision = revision + 1 WHERE id = 1'


def upgrade() -> None:
    op.create_table('config_revision',
                    sa.Column('id', sa.Integer(), primary_key=True, autoincrement=False),
                    sa.Column('revision', sa.BigInteger(), nullable=False, server_default='0'))
    op.execute('INSERT INTO config_revision (id, revision) VALUES (1, 0)')
    if op.get_bind().dialect.name == 'postgresql':
        op.execute('CREATE FUNCTION claimbroker_bump_config_revision() RETURNS trigger LANGUAGE plpgsql AS '
                   f'$$ BEGIN {BUMP}; RETURN NULL; END $$')
        for table in TABLES:
            op.execute(f'CREATE TRIGGER {table}_config_revision AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE '
                       f'ON {table} FOR EACH STATEMENT EXECUTE FUNCTION claimbroker_bump_config_revision()')
    else:
        for table in TABLES:
            for event in ('insert', 'update', 'delete'):
                op.execute(f'CREATE TRIGGER {table}_config_revision_{event} AFTER {event.upper()} ON {table} '
                           f'BEGIN {BUMP}; END')


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        for table in TABLES:
            op.execute(f'DROP TRIGGER {table}_config_revision ON {table}')
        op.execute('DROP FUNCTION claimbroker_bump_config_revision()')
    else:
        for table in TABLES:
            for event in ('insert', 'update', 'delete'):
                op.execute(f'DROP TRIGGER {table}_config_revision_{event}')
    op.drop_table('config_revision')
