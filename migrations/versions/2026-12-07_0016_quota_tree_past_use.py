"""Nested cohorts, fair sharing's half-life and past use (issue 41)

- cohorts.parent (null: a top cohort) and cohort_quotas: a cohort's own nominal, borrowingLimit and
  lendingLimit per flavor, shared by its subtree, as quotas has them per tenant.
- quota_settings: one row (id 1) of settings of the whole quota configuration; half_life_s is
  fairSharing.halfLife in seconds (0: shares count only what runs now).
- past_use: per tenant and flavor, the GPU units it held averaged over time with that half-life, as of a
  time (unix seconds): written by the allocator in its decision transaction, so a restart goes on from it.

cohort_quotas and quota_settings are configuration: the triggers of 0015 move config_revision on their
writes too. On SQLite cohorts.parent is a plain column (the broker checks it names a cohort): SQLite drops
no column that has a foreign key, and rebuilding cohorts to take it back fails while tenants refer to it;
ALTER TABLE keeps the table and with it 0015's triggers.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 07:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

NEW_TABLES = ('cohort_quotas', 'quota_settings')
BUMP = 'UPDATE config_revision SET revision = revision + 1 WHERE id = 1'
EVENTS = ('insert', 'update', 'delete')


def _sqlite_triggers(table: str) -> None:
    for event in EVENTS:
        op.execute(f'CREATE TRIGGER {table}_config_revision_{event} AFTER {event.upper()} ON {table} '
                   f'BEGIN {BUMP}; END')


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == 'postgresql'
    if postgres:
        op.add_column('cohorts', sa.Column('parent', sa.String(length=253), nullable=True))
        op.create_foreign_key(op.f('fk_cohorts_parent_cohorts'), 'cohorts', 'cohorts', ['parent'], ['name'])
    else:
        op.execute('ALTER TABLE cohorts ADD COLUMN parent VARCHAR(253)')
    op.create_table(
        'cohort_quotas',
        sa.Column('cohort', sa.String(length=253), nullable=False),
        sa.Column('flavor', sa.String(length=253), nullable=False),
        sa.Column('nominal', sa.Integer(), nullable=False),
        sa.Column('borrowing_limit', sa.Integer(), nullable=True),
        sa.Column('lending_limit', sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(['cohort'], ['cohorts.name'], name=op.f('fk_cohort_quotas_cohort_cohorts'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('cohort', 'flavor', name=op.f('pk_cohort_quotas')),
    )
    op.create_table(
        'quota_settings',
        sa.Column('id', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('half_life_s', sa.Float(), server_default='0', nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_settings')),
    )
    op.execute('INSERT INTO quota_settings (id, half_life_s) VALUES (1, 0)')
    op.create_table(
        'past_use',
        sa.Column('tenant', sa.String(length=253), nullable=False),
        sa.Column('flavor', sa.String(length=253), nullable=False),
        sa.Column('units', sa.Float(), nullable=False),
        sa.Column('as_of', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('tenant', 'flavor', name=op.f('pk_past_use')),
    )
    for table in NEW_TABLES:
        if postgres:
            op.execute(f'CREATE TRIGGER {table}_config_revision AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE '
                       f'ON {table} FOR EACH STATEMENT EXECUTE FUNCTION claimbroker_bump_config_revision()')
        else:
            _sqlite_triggers(table)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == 'postgresql'
    op.drop_table('past_use')
    for table in NEW_TABLES:  # dropping a table drops its triggers
        op.drop_table(table)
    if postgres:
        op.drop_constraint(op.f('fk_cohorts_parent_cohorts'), 'cohorts', type_='foreignkey')
        op.drop_column('cohorts', 'parent')
    else:
        op.execute('ALTER TABLE cohorts DROP COLUMN parent')
