"""tenants' minRuntime and maxPreemptionsPerMinute: preemption that does not thrash

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 13:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tenants') as batch:
        batch.add_column(sa.Column('min_runtime_s', sa.Float(), nullable=True))
        batch.add_column(sa.Column('max_preemptions_per_minute', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('max_preemptions_per_minute')
        batch.drop_column('min_runtime_s')
