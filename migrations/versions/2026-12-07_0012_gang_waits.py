"""tenants' gangReserveAfter in the ledger; gang_waits: the clocks of waiting gangs, kept across restarts

A tenant's gangReserveAfter (seconds; null: the broker's default, 0: off) joins its other settings. Each
waiting gang's two clocks (since when it has been first in its tenant's order, for gangReserveAfter; since
when it has been complete, for its gang-topology-wait) are rows of gang_waits, written by the allocator as
they change, so a restarted allocator goes on counting from where the last one was.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 01:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tenants') as batch:
        batch.add_column(sa.Column('gang_reserve_after_s', sa.Float(), nullable=True))
    op.create_table(
        'gang_waits',
        sa.Column('tenant', sa.String(length=253), nullable=False),
        sa.Column('gang', sa.String(length=253), nullable=False),
        sa.Column('complete_since', sa.Float(), nullable=True),
        sa.Column('first_since', sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint('tenant', 'gang', name=op.f('pk_gang_waits')),
    )


def downgrade() -> None:
    op.drop_table('gang_waits')
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('gang_reserve_after_s')
