"""Precision A/B comparisons: one spec trained once per precision.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

"""
from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0002'
down_revision: str | Sequence[str] | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('comparisons',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('runs', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_comparisons'))
    )
    op.create_index(op.f('ix_comparisons_owner_created_at'), 'comparisons', ['owner', 'created_at'], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f('ix_comparisons_owner_created_at'), table_name='comparisons')
    op.drop_table('comparisons')
