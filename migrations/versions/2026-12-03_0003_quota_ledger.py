"""quota ledger: flavor and units per allocated device, claim arrival, explain and history, allocator leases

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 07:40:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('claims') as batch:
        batch.add_column(sa.Column('arrival', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('allocated_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('explain', sa.JSON(), nullable=True))
    with op.batch_alter_table('device_allocations') as batch:
        batch.add_column(sa.Column('flavor', sa.String(length=253), nullable=True))
        batch.add_column(sa.Column('units', sa.Float(), nullable=False, server_default='0'))
        batch.create_index('ix_device_allocations_flavor', ['flavor'])
    op.create_table('claim_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('claim_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.Column('sequence', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('node', sa.String(length=253), nullable=True),
    sa.Column('by', sa.String(length=512), nullable=True),
    sa.ForeignKeyConstraint(['claim_id'], ['claims.id'], name=op.f('fk_claim_events_claim_id_claims'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_claim_events'))
    )
    op.create_index(op.f('ix_claim_events_claim_id'), 'claim_events', ['claim_id'], unique=False)
    op.create_table('allocator_leases',
    sa.Column('shard', sa.String(length=64), nullable=False),
    sa.Column('holder', sa.String(length=253), nullable=True),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revision', sa.BigInteger(), nullable=False, server_default='0'),
    sa.PrimaryKeyConstraint('shard', name=op.f('pk_allocator_leases'))
    )


def downgrade() -> None:
    op.drop_table('allocator_leases')
    op.drop_index(op.f('ix_claim_events_claim_id'), table_name='claim_events')
    op.drop_table('claim_events')
    with op.batch_alter_table('device_allocations') as batch:
        batch.drop_index('ix_device_allocations_flavor')
        batch.drop_column('units')
        batch.drop_column('flavor')
    with op.batch_alter_table('claims') as batch:
        batch.drop_column('explain')
        batch.drop_column('allocated_at')
        batch.drop_column('arrival')
