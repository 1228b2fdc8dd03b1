"""The first schema: projects, api_keys, files, jobs, job_events, checkpoints."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create every table."""
    op.create_table(
        "projects",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked", sa.Boolean, nullable=False),
    )
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("deleted", sa.Boolean, nullable=False),
    )
    op.create_index("ix_files_project_id", "files", ["project_id"])
    op.create_table(
        "jobs",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("training_file", sa.String(64), nullable=True),
        sa.Column("validation_file", sa.String(64), nullable=True),
        sa.Column("suffix", sa.String(64), nullable=True),
        sa.Column("seed", sa.Integer, nullable=True),
        sa.Column("hyperparameters", sa.JSON, nullable=False),
        sa.Column("method", sa.JSON, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("backend_ref", sa.JSON, nullable=True),
        sa.Column("run_dir", sa.Text, nullable=True),
        sa.Column("events_seen", sa.Integer, nullable=False),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("fine_tuned_model", sa.String(512), nullable=True),
        sa.Column("trained_tokens", sa.BigInteger, nullable=True),
        sa.Column("requested", sa.String(16), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
    )
    op.create_index("ix_jobs_project_seq", "jobs", ["project_id", "seq"])
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "job_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("level", sa.String(8), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("data", sa.JSON, nullable=True),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_table(
        "checkpoints",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("metrics", sa.JSON, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_checkpoints_job_id", "checkpoints", ["job_id"])


def downgrade() -> None:
    """Drop every table."""
    for table in ("checkpoints", "job_events", "jobs", "files", "api_keys", "projects"):
        op.drop_table(table)
