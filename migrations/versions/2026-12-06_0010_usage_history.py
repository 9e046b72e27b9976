"""usage_samples and claims.flavor: the usage page's fleet over time and waits before admission per flavor

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 15:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'usage_samples',
        sa.Column('at', sa.BigInteger(), nullable=False),
        sa.Column('tenant', sa.String(length=253), nullable=False),
        sa.Column('flavor', sa.String(length=253), nullable=False),
        sa.Column('used', sa.Integer(), nullable=False),
        sa.Column('nominal', sa.Integer(), nullable=False),
        sa.Column('capacity', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('at', 'tenant', 'flavor', name=op.f('pk_usage_samples')),
    )
    with op.batch_alter_table('claims') as batch:
        batch.add_column(sa.Column('flavor', sa.String(length=253), nullable=True))
        batch.create_index('ix_claims_allocated_at', ['allocated_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('claims') as batch:
        batch.drop_index('ix_claims_allocated_at')
        batch.drop_column('flavor')
    op.drop_table('usage_samples')
