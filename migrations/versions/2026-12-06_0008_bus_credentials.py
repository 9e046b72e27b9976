"""bus credentials: per-tenant and alert-reader identities on NATS, bcrypt-hashed

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 12:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'bus_credentials',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
        sa.Column('user', sa.String(length=300), nullable=False),
        sa.Column('role', sa.String(length=16), nullable=False),
        sa.Column('tenant', sa.String(length=253), nullable=True),
        sa.Column('password_hash', sa.String(length=128), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'),
                  nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_bus_credentials')),
        sa.UniqueConstraint('user', name=op.f('uq_bus_credentials_user')),
    )


def downgrade() -> None:
    op.drop_table('bus_credentials')
