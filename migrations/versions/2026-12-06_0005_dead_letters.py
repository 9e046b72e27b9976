"""dead letters and stream sequences of submissions and releases: no message takes another with it, no release is lost

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06 03:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('claims') as batch:
        batch.add_column(sa.Column('submitted_seq', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('released_seq', sa.BigInteger(), nullable=True))
    op.create_table(
        'dead_letters',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
        sa.Column('consumer', sa.String(length=64), nullable=False),
        sa.Column('message_id', sa.String(length=255), nullable=False),
        sa.Column('subject', sa.Text(), nullable=False),
        sa.Column('payload', sa.LargeBinary(), nullable=False),
        sa.Column('payload_size', sa.BigInteger(), nullable=False),
        sa.Column('error', sa.Text(), nullable=False),
        sa.Column('deliveries', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'),
                  nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_dead_letters')),
    )
    op.create_index(op.f('ix_dead_letters_message_id'), 'dead_letters', ['message_id'])


def downgrade() -> None:
    op.drop_index(op.f('ix_dead_letters_message_id'), table_name='dead_letters')
    op.drop_table('dead_letters')
    with op.batch_alter_table('claims') as batch:
        batch.drop_column('released_seq')
        batch.drop_column('submitted_seq')
