"""Sweeps: the sweeps table; jobs learn which sweep they are a trial of (and with which values) and keep their
run's result.json."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the sweeps table and jobs.sweep_id, jobs.sweep_values, jobs.result."""
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("objective", sa.String(64), nullable=False),
        sa.Column("direction", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_sweeps_project_id", "sweeps", ["project_id"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("sweep_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("sweep_values", sa.JSON, nullable=True))
        batch.add_column(sa.Column("result", sa.JSON, nullable=True))
        batch.create_index("ix_jobs_sweep_id", ["sweep_id"])


def downgrade() -> None:
    """Remove them again."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_sweep_id")
        batch.drop_column("result")
        batch.drop_column("sweep_values")
        batch.drop_column("sweep_id")
    op.drop_index("ix_sweeps_project_id", "sweeps")
    op.drop_table("sweeps")
