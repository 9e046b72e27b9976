"""claims: the last start estimate published for a waiting claim, and the first one

estimated_start is the contract's object last published on the claim's status subject ({"p50", "p90",
"blockedBy"}, RFC 3339), served by the admin API and carried by its later Pending statuses; estimate_p50 and
first_estimate_p50 (unix seconds) are the last and the first p50 published, kept after allocation so the
estimates' error against allocated_at can be measured. All null for claims from before.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 02:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('claims') as batch:
        batch.add_column(sa.Column('estimated_start', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('estimate_p50', sa.Float(), nullable=True))
        batch.add_column(sa.Column('first_estimate_p50', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('claims') as batch:
        batch.drop_column('first_estimate_p50')
        batch.drop_column('estimate_p50')
        batch.drop_column('estimated_start')
