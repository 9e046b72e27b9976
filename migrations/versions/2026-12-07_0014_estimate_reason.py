"""claims: why the start estimate last published for a waiting claim is null

estimate_reason is the contract's estimatedStartReason published with a null estimatedStart (no device could
ever satisfy it, Rejected as written, an incomplete gang, no start within the horizon): kept so that its later
Pending statuses, `explain` and GET /v1/claims still say why, and so that a restarted estimator knows the null
was published. Null for claims from before, and whenever the last estimate published had a value.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 04:30:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('claims') as batch:
        batch.add_column(sa.Column('estimate_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('claims') as batch:
        batch.drop_column('estimate_reason')
