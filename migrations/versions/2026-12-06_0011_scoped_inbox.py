"""inbox ids per kind and tenant, pruned; releases of unknown claims in early_releases, not claim rows

The inbox's key gains the message's kind and tenant (one tenant's Nats-Msg-Id no longer hides another's)
and an index on (consumer, processed_at) for pruning. Rows already there keep kind '' (legacy): they count for every
kind and tenant, as JetStream's window did when they were written, until pruned. The Released rows that a
release of an unknown claim left (sequence 0, no status) move to early_releases, which expires; outbox rows
may carry a TTL for JetStream.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 18:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

_claims = sa.table(
    'claims', sa.column('namespace', sa.String), sa.column('name', sa.String), sa.column('state', sa.String),
    sa.column('spec', sa.JSON), sa.column('priority', sa.Integer), sa.column('preemptible', sa.Boolean),
    sa.column('reason', sa.Text), sa.column('sequence', sa.Integer), sa.column('released_seq', sa.BigInteger),
    sa.column('updated_at', sa.DateTime(timezone=True)))
_early = sa.table(
    'early_releases', sa.column('tenant', sa.String), sa.column('name', sa.String),
    sa.column('released_seq', sa.BigInteger), sa.column('released_at', sa.DateTime(timezone=True)))
_inbox = sa.table('inbox', sa.column('consumer', sa.String), sa.column('message_id', sa.String),
                  sa.column('kind', sa.String), sa.column('tenant', sa.String))
# What releases of unknown claims left before this revision: Released rows that never had a status.
_TOMBSTONE = sa.and_(_claims.c.state == 'Released', _claims.c.sequence == 0, _claims.c.released_seq.is_not(None))


def upgrade() -> None:
    with op.batch_alter_table('inbox') as batch:
        batch.add_column(sa.Column('kind', sa.String(length=16), server_default='', nullable=False))
        batch.add_column(sa.Column('tenant', sa.String(length=253), server_default='', nullable=False))
        batch.drop_constraint('pk_inbox', type_='primary')
        batch.create_primary_key('pk_inbox', ['consumer', 'message_id', 'kind', 'tenant'])
        batch.create_index('ix_inbox_consumer_processed_at', ['consumer', 'processed_at'], unique=False)
    op.create_table(
        'early_releases',
        sa.Column('tenant', sa.String(length=253), nullable=False),
        sa.Column('name', sa.String(length=253), nullable=False),
        sa.Column('released_seq', sa.BigInteger(), nullable=False),
        sa.Column('released_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('tenant', 'name', name=op.f('pk_early_releases')),
    )
    op.create_index(op.f('ix_early_releases_released_at'), 'early_releases', ['released_at'], unique=False)
    with op.batch_alter_table('outbox') as batch:
        batch.add_column(sa.Column('ttl_s', sa.Float(), nullable=True))
    op.execute(_early.insert().from_select(
        ['tenant', 'name', 'released_seq', 'released_at'],
        sa.select(_claims.c.namespace, _claims.c.name, _claims.c.released_seq, _claims.c.updated_at).where(_TOMBSTONE)))
    op.execute(_claims.delete().where(_TOMBSTONE))


def downgrade() -> None:
    # Remembered releases go back to what the older version reads: a Released row without a status.
    op.execute(_claims.insert().from_select(
        ['namespace', 'name', 'state', 'spec', 'priority', 'preemptible', 'reason', 'sequence', 'released_seq'],
        sa.select(_early.c.tenant, _early.c.name, sa.literal('Released'), sa.cast(sa.literal('{}'), sa.JSON),
                  sa.literal(0), sa.true(), sa.literal('released by the tenant before the broker read its submission'),
                  sa.literal(0), _early.c.released_seq)))
    with op.batch_alter_table('outbox') as batch:
        batch.drop_column('ttl_s')
    op.drop_index(op.f('ix_early_releases_released_at'), table_name='early_releases')
    op.drop_table('early_releases')
    # One row per (consumer, id), as the older key wants: an id then counts for every kind and tenant.
    other = _inbox.alias('other')
    op.execute(_inbox.delete().where(sa.exists().where(
        other.c.consumer == _inbox.c.consumer, other.c.message_id == _inbox.c.message_id,
        sa.or_(other.c.kind < _inbox.c.kind, sa.and_(other.c.kind == _inbox.c.kind, other.c.tenant < _inbox.c.tenant)))))
    with op.batch_alter_table('inbox') as batch:
        batch.drop_index('ix_inbox_consumer_processed_at')
        batch.drop_constraint('pk_inbox', type_='primary')
        batch.create_primary_key('pk_inbox', ['consumer', 'message_id'])
        batch.drop_column('tenant')
        batch.drop_column('kind')
