"""alert history and webhook dead letters

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 07:10:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('alerts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('key', sa.String(length=512), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('severity', sa.String(length=16), nullable=False),
    sa.Column('tenant', sa.String(length=253), nullable=True),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('labels', sa.JSON(), nullable=False),
    sa.Column('first_seen', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.Column('resolved', sa.Boolean(), nullable=False),
    sa.Column('resolved_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alerts')),
    sa.UniqueConstraint('key', 'first_seen', name=op.f('uq_alerts_key'))
    )
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_alerts_kind'), ['kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_alerts_tenant'), ['tenant'], unique=False)
        batch_op.create_index(batch_op.f('ix_alerts_last_seen'), ['last_seen'], unique=False)
        batch_op.create_index(batch_op.f('ix_alerts_resolved'), ['resolved'], unique=False)

    op.create_table('webhook_dead_letters',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('alert_key', sa.String(length=512), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_dead_letters'))
    )
    with op.batch_alter_table('webhook_dead_letters', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_dead_letters_alert_key'), ['alert_key'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('webhook_dead_letters', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_dead_letters_alert_key'))

    op.drop_table('webhook_dead_letters')
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_alerts_resolved'))
        batch_op.drop_index(batch_op.f('ix_alerts_last_seen'))
        batch_op.drop_index(batch_op.f('ix_alerts_tenant'))
        batch_op.drop_index(batch_op.f('ix_alerts_kind'))

    op.drop_table('alerts')
