"""tenants marked for adminAccess; API tokens that expire and can be revoked

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06 09:30:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tenants') as batch:
        batch.add_column(sa.Column('admin_access', sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table('api_tokens') as batch:
        batch.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('api_tokens') as batch:
        batch.drop_column('revoked_at')
        batch.drop_column('expires_at')
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('admin_access')
