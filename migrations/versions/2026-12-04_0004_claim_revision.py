"""claim revision: the allocator revision that last wrote each claim row, so a cycle reads only what changed

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 18:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('claims') as batch:
        batch.add_column(sa.Column('revision', sa.BigInteger(), nullable=True))
        batch.create_index('ix_claims_revision', ['revision'])
    # rows written before: as of revision 0, so an allocator's first full read covers them
    op.execute("UPDATE claims SET revision = 0")


def downgrade() -> None:
    with op.batch_alter_table('claims') as batch:
        batch.drop_index('ix_claims_revision')
        batch.drop_column('revision')
