"""Initial schema: jobs, job_events, metric_points, api_tokens.

Revision ID: 0001
Revises: 
Create Date: 2026-11-29

"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0001'
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('is_admin', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('name', name=op.f('uq_api_tokens_name')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )
    op.create_table('jobs',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('queue', sa.String(length=16), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('max_steps', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('lease_expires_at', sa.Float(precision=53), nullable=True),
    sa.Column('worker', sa.String(length=200), nullable=True),
    sa.Column('precision_requested', sa.String(length=8), nullable=True),
    sa.Column('precision_effective', sa.String(length=8), nullable=True),
    sa.Column('precision_reason', sa.Text(), nullable=True),
    sa.Column('error_code', sa.String(length=32), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('error_step', sa.Integer(), nullable=True),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('request_hash', sa.String(length=64), nullable=True),
    sa.Column('dispatched_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('telemetry_done', sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('owner', 'idempotency_key', name=op.f('uq_jobs_owner_idempotency_key'))
    )
    op.create_index(op.f('ix_jobs_created_at_id'), 'jobs', ['created_at', 'id'], unique=False)
    op.create_index(op.f('ix_jobs_status'), 'jobs', ['status'], unique=False)
    op.create_index(op.f('ix_jobs_telemetry_done_attempt'), 'jobs', ['telemetry_done', 'attempt'], unique=False)
    op.create_table('job_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('type', sa.String(length=32), nullable=False),
    sa.Column('step', sa.Integer(), nullable=True),
    sa.Column('time', sa.Float(precision=53), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('source_id', sa.String(length=40), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_events_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_events')),
    sa.UniqueConstraint('job_id', 'source_id', name=op.f('uq_job_events_job_id_source_id'))
    )
    op.create_index(op.f('ix_job_events_job_id_id'), 'job_events', ['job_id', 'id'], unique=False)
    op.create_table('metric_points',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('stream_ms', sa.BigInteger(), nullable=False),
    sa.Column('stream_seq', sa.BigInteger(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('time', sa.Float(precision=53), nullable=True),
    sa.Column('loss', sa.Float(precision=53), nullable=True),
    sa.Column('loss_scale', sa.Float(precision=53), nullable=True),
    sa.Column('skipped', sa.Boolean(), nullable=True),
    sa.Column('grad_norm', sa.Float(precision=53), nullable=True),
    sa.Column('lr', sa.Float(precision=53), nullable=True),
    sa.Column('memory_allocated', sa.BigInteger(), nullable=True),
    sa.Column('memory_reserved', sa.BigInteger(), nullable=True),
    sa.Column('memory_peak', sa.BigInteger(), nullable=True),
    sa.Column('samples_per_second', sa.Float(precision=53), nullable=True),
    sa.Column('step_time_ms', sa.Float(precision=53), nullable=True),
    sa.Column('skipped_steps', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_metric_points_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_metric_points')),
    sa.UniqueConstraint('job_id', 'attempt', 'step', name=op.f('uq_metric_points_job_id_attempt_step'))
    )
    op.create_index(op.f('ix_metric_points_job_id_step'), 'metric_points', ['job_id', 'step'], unique=False)
    op.create_index(op.f('ix_metric_points_job_id_stream_ms_stream_seq'), 'metric_points', ['job_id', 'stream_ms', 'stream_seq'], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f('ix_metric_points_job_id_stream_ms_stream_seq'), table_name='metric_points')
    op.drop_index(op.f('ix_metric_points_job_id_step'), table_name='metric_points')
    op.drop_table('metric_points')
    op.drop_index(op.f('ix_job_events_job_id_id'), table_name='job_events')
    op.drop_table('job_events')
    op.drop_index(op.f('ix_jobs_telemetry_done_attempt'), table_name='jobs')
    op.drop_index(op.f('ix_jobs_status'), table_name='jobs')
    op.drop_index(op.f('ix_jobs_created_at_id'), table_name='jobs')
    op.drop_table('jobs')
    op.drop_table('api_tokens')
