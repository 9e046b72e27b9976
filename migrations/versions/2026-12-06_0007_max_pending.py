"""tenants' maxPending: the waiting claims a tenant may hold

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06 10:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tenants') as batch:
        batch.add_column(sa.Column('max_pending', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('max_pending')
