"""The server's database: one :class:`Store` over SQLAlchemy (SQLite by default, PostgreSQL by URL).

Every method opens its own short transaction and returns plain dicts, so routes, the runner and its follower
threads share one Store safely. The schema is Alembic's (``migrations/``), brought up to date by :func:`migrate`
whenever a Store opens. API keys are stored as their sha256 digest (the keys are 256 random bits, so a plain
digest cannot be searched) and a short prefix to recognise them by; the key itself is shown once, at creation.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import create_engine, event, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from ..errors import SpecError
from ..paths import state_path
from .models import ApiKey, Checkpoint, File, Job, JobEvent, Project, Sweep

__all__ = ["Store", "default_url", "migrate", "new_id", "KEY_PREFIX"]

KEY_PREFIX = "kt-"
_LEAD_KEY = 0x6B74756E65  # the advisory lock of the process that runs the jobs ("ktune")
DEFAULT_PROJECT = "default"


def default_url() -> str:
    """SQLite in the state directory: ``~/.local/state/kubetune/server/kubetune.db`` (``$KUBETUNE_HOME/server`` when set)."""
    d = state_path("server")
    return f"sqlite:///{d / 'kubetune.db'}"


def new_id(prefix: str) -> str:
    """A fresh id in OpenAI's style, e.g. ``ftjob-3f9c...`` (24 hex digits)."""
    return f"{prefix}-{secrets.token_hex(12)}"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _engine(url: str) -> Engine:
    if url.startswith(("postgres://", "postgresql://")):  # SQLAlchemy's default driver would be psycopg2
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    try:
        if url.startswith("sqlite"):
            path = url.split(":///", 1)[1] if ":///" in url else ""
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            # A connection per transaction (NullPool): a pooled pysqlite connection was seen to keep reading an old
            # snapshot after another process (the CLI revoking a key) committed; opening a SQLite file is cheap.
            engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, poolclass=NullPool)

            @event.listens_for(engine, "connect")
            def _pragmas(dbapi_conn, _record):
                dbapi_conn.isolation_level = None  # transactions are SQLAlchemy's (BEGIN below), never the driver's
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA busy_timeout=30000")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.close()

            @event.listens_for(engine, "begin")
            def _begin(conn):  # every session is one real transaction: a read sees what other processes committed
                conn.exec_driver_sql("BEGIN")

            return engine
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    except Exception as e:  # an unknown dialect, a missing driver, a malformed URL
        raise SpecError(f"--db {url.split('@')[-1]}: {e}", hint="use sqlite:///PATH or postgresql://USER@HOST/DB") from None


def migrate(engine: Engine) -> None:
    """Bring the schema up to the newest migration (Alembic, programmatically; safe to run on every start)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    if engine.dialect.name == "sqlite":  # kept in the file: readers never wait for the follower's writes
        raw = engine.raw_connection()
        try:
            raw.cursor().execute("PRAGMA journal_mode=WAL")
        finally:
            raw.close()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    engine.dispose()  # the pool starts afresh, without the migration's connection


def _row(obj: Any) -> dict:
    d = {c.key: getattr(obj, c.key) for c in obj.__mapper__.column_attrs}
    return d


class Store:
    """The server's records. ``url``: a SQLAlchemy URL (None: SQLite under the kubetune home).

    Raises:
        SpecError: the URL cannot be used (unknown database, driver missing).
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = url or default_url()
        self.engine = _engine(self.url)
        migrate(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed when the block ends, rolled back when it raises."""
        with self._sessions.begin() as s:
            yield s

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def try_lead(self) -> bool:
        """Whether this process runs the jobs: true for exactly one server process per database at a time.

        PostgreSQL: a session-level advisory lock held on a connection of its own (released when the process
        dies, so another replica takes over); SQLite: an exclusive lock on a file beside the database. Call it on
        every turn of the runner: it keeps (or takes, or retakes after a lost connection) the lead.
        """
        if self.engine.dialect.name == "sqlite":
            return self._lead_file()
        from sqlalchemy import text

        conn = getattr(self, "_lead_conn", None)
        try:
            if conn is None:
                conn = self.engine.connect()
                self._lead_conn = conn
                self._leading = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _LEAD_KEY}).scalar())
                conn.commit()
                if not self._leading:
                    conn.close()
                    self._lead_conn = None
                return self._leading
            conn.execute(text("SELECT 1")).scalar()  # still connected: still holding the lock
            conn.commit()
            return True
        except Exception:
            try:
                conn.close()
            except Exception:
                pass
            self._lead_conn = None
            return False

    def _lead_file(self) -> bool:
        import fcntl

        if getattr(self, "_lead_fd", None) is not None:
            return True
        path = self.url.split(":///", 1)[1] if ":///" in self.url else ""
        lock = Path((path or str(state_path("server") / "memory")) + ".runner.lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lead_fd = fd
        return True

    # -- projects and keys ------------------------------------------------------------------------
    def project(self, name: str) -> dict:
        """The project called ``name``, created when new."""
        with self.session() as s:
            p = s.scalar(select(Project).where(Project.name == name))
            if p is None:
                p = Project(id=new_id("proj"), name=name, created_at=time.time())
                s.add(p)
            return _row(p)

    def create_key(self, project: str) -> tuple[str, dict]:
        """A new API key for ``project`` (created when new): the key itself (shown once) and its record."""
        p = self.project(project)
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with self.session() as s:
            k = ApiKey(id=new_id("key"), project_id=p["id"], digest=_digest(key), prefix=key[:10], created_at=time.time(), revoked=False)
            s.add(k)
            rec = _row(k)
        rec.pop("digest")
        return key, {**rec, "project": project}

    def import_key(self, project: str, key: str) -> tuple[bool, dict]:
        """Register a key made elsewhere (a Kubernetes Secret) for ``project``; a key already known is left as it is.

        Returns:
            (whether it was added, its record: never the key or its digest).
        """
        digest = _digest(key)
        with self.session() as s:
            known = s.scalar(select(ApiKey).where(ApiKey.digest == digest))
            if known is not None:
                rec = _row(known)
                rec.pop("digest")
                return False, rec
        p = self.project(project)
        with self.session() as s:
            k = ApiKey(id=new_id("key"), project_id=p["id"], digest=digest, prefix=key[:10], created_at=time.time(), revoked=False)
            s.add(k)
            rec = _row(k)
        rec.pop("digest")
        return True, {**rec, "project": project}

    def list_keys(self) -> list[dict]:
        """Every key's record (prefix, project, created, revoked), never a digest."""
        with self.session() as s:
            rows = s.execute(select(ApiKey, Project.name).join(Project, ApiKey.project_id == Project.id).order_by(ApiKey.created_at)).all()
            return [{**{k: v for k, v in _row(a).items() if k != "digest"}, "project": name} for a, name in rows]

    def revoke_key(self, key_id_or_prefix: str) -> bool:
        """Revoke the key with this id or prefix; False when none matches."""
        with self.session() as s:
            res = s.execute(update(ApiKey).where((ApiKey.id == key_id_or_prefix) | (ApiKey.prefix == key_id_or_prefix)).values(revoked=True))
            return bool(res.rowcount)

    def has_keys(self) -> bool:
        """Whether any key that is not revoked exists (else the server runs open, on loopback only)."""
        with self.session() as s:
            return bool(s.scalar(select(func.count()).select_from(ApiKey).where(ApiKey.revoked.is_(False))))

    def authenticate(self, key: str) -> dict | None:
        """The project of ``key`` (None: no such key, or revoked)."""
        with self.session() as s:
            row = s.execute(
                select(Project).join(ApiKey, ApiKey.project_id == Project.id).where(ApiKey.digest == _digest(key), ApiKey.revoked.is_(False))
            ).scalar_one_or_none()
            return _row(row) if row is not None else None

    # -- files ------------------------------------------------------------------------------------
    def add_file(self, project_id: str, *, file_id: str, filename: str, purpose: str, size: int, path: str) -> dict:
        """Record an uploaded file."""
        with self.session() as s:
            f = File(id=file_id, project_id=project_id, filename=filename, purpose=purpose, bytes=size, path=path, created_at=time.time(), deleted=False)
            s.add(f)
            return _row(f)

    def get_file(self, project_id: str, file_id: str) -> dict | None:
        """The project's file (None: none, deleted, or another project's)."""
        with self.session() as s:
            f = s.scalar(select(File).where(File.id == file_id, File.project_id == project_id, File.deleted.is_(False)))
            return _row(f) if f else None

    def list_files(self, project_id: str, purpose: str | None = None) -> list[dict]:
        """The project's files, newest first."""
        with self.session() as s:
            q = select(File).where(File.project_id == project_id, File.deleted.is_(False))
            if purpose:
                q = q.where(File.purpose == purpose)
            return [_row(f) for f in s.scalars(q.order_by(File.created_at.desc()))]

    def delete_file(self, project_id: str, file_id: str) -> dict | None:
        """Mark the project's file deleted and return its record (None: not found)."""
        with self.session() as s:
            f = s.scalar(select(File).where(File.id == file_id, File.project_id == project_id, File.deleted.is_(False)))
            if f is None:
                return None
            f.deleted = True
            return _row(f)

    # -- jobs -------------------------------------------------------------------------------------
    def add_job(self, **fields: Any) -> dict:
        """Record a new job (``id``, ``project_id``, ``model``, ``status``, ``backend``, ...)."""
        with self.session() as s:
            j = Job(created_at=time.time(), events_seen=0, **fields)
            s.add(j)
            s.flush()
            return _row(j)

    def get_job(self, project_id: str | None, job_id: str) -> dict | None:
        """The job (None: none, or another project's; ``project_id`` None: any project's)."""
        with self.session() as s:
            q = select(Job).where(Job.id == job_id)
            if project_id is not None:
                q = q.where(Job.project_id == project_id)
            j = s.scalar(q)
            return _row(j) if j else None

    def list_jobs(self, project_id: str, *, after: str | None = None, limit: int = 20, kind: str | None = None,
                  sweep_id: str | None = None) -> tuple[list[dict], bool]:
        """The project's jobs (of one kind, or one sweep's trials), newest first, after the job ``after``; and whether more follow."""
        with self.session() as s:
            q = select(Job).where(Job.project_id == project_id)
            if kind:
                q = q.where(Job.kind == kind)
            if sweep_id:
                q = q.where(Job.sweep_id == sweep_id)
            if after:
                cursor = s.scalar(select(Job.seq).where(Job.id == after, Job.project_id == project_id))
                if cursor is not None:
                    q = q.where(Job.seq < cursor)
            rows = [_row(j) for j in s.scalars(q.order_by(Job.seq.desc()).limit(limit + 1))]
            return rows[:limit], len(rows) > limit

    def jobs_in(self, statuses: tuple[str, ...]) -> list[dict]:
        """Every project's jobs in one of ``statuses``, oldest first (the queue's order)."""
        with self.session() as s:
            return [_row(j) for j in s.scalars(select(Job).where(Job.status.in_(statuses)).order_by(Job.seq))]

    def update_job(self, job_id: str, *, expect: tuple[str, ...] | None = None, **fields: Any) -> bool:
        """Change a job's fields; with ``expect``, only while its status is one of those (False: it was not)."""
        with self.session() as s:
            q = update(Job).where(Job.id == job_id)
            if expect:
                q = q.where(Job.status.in_(expect))
            return bool(s.execute(q.values(**fields)).rowcount)

    def delete_job(self, job_id: str) -> None:
        """Remove a job and its events and checkpoints."""
        from sqlalchemy import delete

        with self.session() as s:
            s.execute(delete(JobEvent).where(JobEvent.job_id == job_id))
            s.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id))
            s.execute(delete(Job).where(Job.id == job_id))

    # -- sweeps -------------------------------------------------------------------------------------
    def add_sweep(self, **fields: Any) -> dict:
        """Record a sweep (``id``, ``project_id``, ``name``, ``objective``, ``direction``, ``spec``)."""
        with self.session() as s:
            sw = Sweep(created_at=time.time(), **fields)
            s.add(sw)
            return _row(sw)

    def get_sweep(self, project_id: str, sweep_id: str) -> dict | None:
        """The project's sweep (None: none, or another project's)."""
        with self.session() as s:
            sw = s.scalar(select(Sweep).where(Sweep.id == sweep_id, Sweep.project_id == project_id))
            return _row(sw) if sw else None

    def list_sweeps(self, project_id: str) -> list[dict]:
        """The project's sweeps, newest first."""
        with self.session() as s:
            return [_row(sw) for sw in s.scalars(select(Sweep).where(Sweep.project_id == project_id).order_by(Sweep.created_at.desc()))]

    # -- events and checkpoints -------------------------------------------------------------------
    def add_events(self, job_id: str, events: list[dict], *, seen: int | None = None, **job_fields: Any) -> None:
        """Append events (``created_at``, ``level``, ``type``, ``message``, ``data``) to a job, in one transaction
        with ``events_seen`` = ``seen`` and any other job fields, so a restart copies each event exactly once."""
        with self.session() as s:
            for ev in events:
                s.add(JobEvent(job_id=job_id, **ev))
            values = dict(job_fields)
            if seen is not None:
                values["events_seen"] = seen
            if values:
                s.execute(update(Job).where(Job.id == job_id).values(**values))

    def list_events(self, job_id: str, *, after: str | None = None, limit: int = 20, oldest_first: bool = False) -> tuple[list[dict], bool]:
        """A job's events, newest first (``after``: an event id, ``ftevent-<seq>``); and whether more follow."""
        with self.session() as s:
            q = select(JobEvent).where(JobEvent.job_id == job_id)
            if after and after.rsplit("-", 1)[-1].isdigit():
                n = int(after.rsplit("-", 1)[-1])
                q = q.where(JobEvent.seq > n if oldest_first else JobEvent.seq < n)
            q = q.order_by(JobEvent.seq if oldest_first else JobEvent.seq.desc()).limit(limit + 1)
            rows = [_row(e) for e in s.scalars(q)]
            return rows[:limit], len(rows) > limit

    def add_checkpoint(self, job_id: str, *, step: int, path: str, metrics: dict | None, created_at: float) -> None:
        """Record a complete checkpoint."""
        with self.session() as s:
            s.add(Checkpoint(job_id=job_id, step=step, path=path, metrics=metrics, created_at=created_at))

    def list_checkpoints(self, job_id: str, *, after: str | None = None, limit: int = 10) -> tuple[list[dict], bool]:
        """A job's checkpoints, newest first; and whether more follow."""
        with self.session() as s:
            q = select(Checkpoint).where(Checkpoint.job_id == job_id)
            if after and after.rsplit("-", 1)[-1].isdigit():
                q = q.where(Checkpoint.seq < int(after.rsplit("-", 1)[-1]))
            rows = [_row(c) for c in s.scalars(q.order_by(Checkpoint.seq.desc()).limit(limit + 1))]
            return rows[:limit], len(rows) > limit
