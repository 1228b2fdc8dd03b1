"""The server's tables (SQLAlchemy 2 declarative): projects, API keys (hashed), files, jobs, job events and
checkpoints. The schema itself is created and changed only by the Alembic migrations in ``migrations/``
(:func:`kubetune.server.store.migrate`); these classes must match the newest migration
(``tests/server/test_store.py`` checks it)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "Project", "ApiKey", "File", "Job", "JobEvent", "Checkpoint", "Sweep"]


class Base(DeclarativeBase):
    """Declarative base of the server's tables."""


class Project(Base):
    """A tenant: every file and job belongs to exactly one project."""

    __tablename__ = "projects"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[float] = mapped_column(Float)


class ApiKey(Base):
    """An API key of a project: only its sha256 digest is stored, and a short prefix to recognise it by."""

    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    revoked: Mapped[bool] = mapped_column(default=False)


class File(Base):
    """An uploaded file (``purpose=fine-tune``): its bytes live under the server's data directory."""

    __tablename__ = "files"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    deleted: Mapped[bool] = mapped_column(default=False)


class Job(Base):
    """A fine-tuning job: the request as given, the spec it became, where it runs and what it reached.

    ``seq`` orders jobs (created order, the queue's order and the list's cursor); ``status`` is OpenAI's name;
    ``backend_ref`` is the backend's :class:`~kubetune.backends.JobRef` of the current submission (None while queued).
    """

    __tablename__ = "jobs"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    kind: Mapped[str] = mapped_column(String(16), default="openai")
    model: Mapped[str] = mapped_column(String(256))
    training_file: Mapped[str | None] = mapped_column(String(64), nullable=True)
    validation_file: Mapped[str | None] = mapped_column(String(64), nullable=True)
    suffix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    seed: Mapped[int | None] = mapped_column(Integer, nullable=True)
    hyperparameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    method: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    extra_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(32))
    backend: Mapped[str] = mapped_column(String(32))
    backend_ref: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    run_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    events_seen: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    fine_tuned_model: Mapped[str | None] = mapped_column(String(512), nullable=True)
    trained_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    requested: Mapped[str | None] = mapped_column(String(16), nullable=True)  # "cancel" / "pause" / "resume" in flight
    sweep_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)  # a trial of this sweep
    sweep_values: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # the trial's swept values
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # result.json of a finished run
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    __table_args__ = (Index("ix_jobs_project_seq", "project_id", "seq"), Index("ix_jobs_status", "status"))


class JobEvent(Base):
    """One event of a job, copied from its run directory (or written by the server: queued, cancelled, ...)."""

    __tablename__ = "job_events"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    level: Mapped[str] = mapped_column(String(8))
    type: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class Checkpoint(Base):
    """A complete checkpoint a job saved (its step, metrics and where it lies)."""

    __tablename__ = "checkpoints"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class Sweep(Base):
    """A sweep submitted to the server: its spec, how it ranks trials; the trials are jobs with its ``sweep_id``."""

    __tablename__ = "sweeps"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    objective: Mapped[str] = mapped_column(String(64))
    direction: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)
