"""Alert rules, their firings and webhook deliveries (the database as the outbox), and a
job's stop reason and outcome (an alert's stop; an early stop ends ``succeeded``).

It only adds tables and two nullable columns.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Epoch = sa.Float(precision=53)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("stop_reason", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("stop_outcome", sa.String(16), nullable=True))
    op.create_table(
        "alert_rules",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(40), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("secret", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_alert_rules_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_rules"),
    )
    op.create_index("ix_alert_rules_owner_id", "alert_rules", ["owner", "id"])
    op.create_index("ix_alert_rules_job_id", "alert_rules", ["job_id"])
    op.create_table(
        "alert_firings",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("rule_id", BigId, nullable=False),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(80), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["rule_id"],
            ["alert_rules.id"],
            name="fk_alert_firings_rule_id_alert_rules",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_alert_firings_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_firings"),
        sa.UniqueConstraint(
            "rule_id",
            "job_id",
            "attempt",
            "key",
            name="uq_alert_firings_rule_id_job_id_attempt_key",
        ),
    )
    op.create_table(
        "alert_deliveries",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("firing_id", BigId, nullable=False),
        sa.Column("rule_id", BigId, nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("format", sa.String(8), nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("next_at", Epoch, nullable=False),
        sa.Column("claim", sa.String(32), nullable=True),
        sa.Column("claimed_until", Epoch, nullable=True),
        sa.Column("history", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["firing_id"],
            ["alert_firings.id"],
            name="fk_alert_deliveries_firing_id_alert_firings",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["rule_id"],
            ["alert_rules.id"],
            name="fk_alert_deliveries_rule_id_alert_rules",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_deliveries"),
    )
    op.create_index("ix_alert_deliveries_status_next_at", "alert_deliveries", ["status", "next_at"])
    op.create_index("ix_alert_deliveries_rule_id_id", "alert_deliveries", ["rule_id", "id"])


def downgrade() -> None:
    op.drop_table("alert_deliveries")
    op.drop_table("alert_firings")
    op.drop_table("alert_rules")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("stop_outcome")
        batch.drop_column("stop_reason")
