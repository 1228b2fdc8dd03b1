"""The server's command line and its database: keys made, listed and revoked by the CLI and stored only as
digests, the refusal to serve a network without keys, the migrations matching the models, and ``kubetune
--help`` staying light."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import cli


def test_keys_are_hashed_listed_and_revoked(tmp_path, db_url):
    from kubetune.server.store import Store

    key = cli("server", "keys", "create", "--project", "alpha", "--db", db_url).stdout.strip()
    assert key.startswith("kt-") and len(key) > 40
    store = Store(db_url)
    assert store.authenticate(key)["name"] == "alpha"
    assert store.authenticate(key + "x") is None
    with store.session() as s:  # only a digest is stored
        from sqlalchemy import text

        rows = [tuple(map(str, r)) for r in s.execute(text("SELECT * FROM api_keys"))]
    assert rows and not any(key in cell for row in rows for cell in row)
    if db_url.startswith("sqlite"):
        assert key.encode() not in (tmp_path / "server.db").read_bytes()

    listed = cli("server", "keys", "list", "--db", db_url).stdout
    assert key[:10] in listed and "alpha" in listed and key not in listed
    assert re.search(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d\b", listed), listed  # local ISO 8601, with its offset
    cli("server", "keys", "revoke", key[:10], "--db", db_url)
    assert store.authenticate(key) is None and not store.has_keys()
    bad = cli("server", "keys", "revoke", "kt-nothing", "--db", db_url, check=False)
    assert bad.returncode == 2 and "no key" in bad.stderr and "Traceback" not in bad.stderr
    store.close()


def test_refuses_a_network_address_without_keys(tmp_path):
    db = f"sqlite:///{tmp_path / 's.db'}"
    proc = cli("server", "--host", "0.0.0.0", "--port", "0", "--db", db, check=False)
    assert proc.returncode == 2
    assert "refusing to serve on 0.0.0.0 without API keys" in proc.stderr and "keys create" in proc.stderr
    assert "Traceback" not in proc.stderr
    bad = cli("server", "--db", "nosuchdb://x", check=False)
    assert bad.returncode == 2 and "--db" in bad.stderr and "Traceback" not in bad.stderr
    conf = tmp_path / "c.yaml"
    conf.write_text("max_running_job: 3\n", encoding="utf-8")
    bad = cli("server", "--config", str(conf), "--db", db, check=False)
    assert bad.returncode == 2 and "max_running_job" in bad.stderr and "Traceback" not in bad.stderr


def test_migrations_match_the_models(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from kubetune.server.models import Base
    from kubetune.server.store import Store

    store = Store(db_url)
    Store(db_url).close()  # migrating an up-to-date database again changes nothing
    with store.engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == "0002"
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diffs == [], diffs
    store.close()


def test_a_database_of_the_first_schema_is_upgraded_with_its_records(db_url):
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from kubetune.server import store as store_module

    engine = store_module._engine(db_url)
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(store_module.__file__).parent / "migrations"))
    with engine.begin() as conn:  # a server of the first version made this database and created a key
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
        conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES ('p1', 'old', 1.0)"))
        conn.execute(text("INSERT INTO api_keys (id, project_id, digest, prefix, created_at, revoked) "
                          "VALUES ('k1', 'p1', :d, 'kt-old', 1.0, false)"), {"d": store_module._digest("kt-old-key")})
    engine.dispose()
    store = store_module.Store(db_url)  # this version: migrated to the newest schema at start
    assert store.authenticate("kt-old-key")["name"] == "old"
    assert store.list_sweeps("p1") == []
    store.close()


def test_help_stays_light():
    code = "import sys, kubetune.cli.main as m; heavy = [x for x in ('sqlalchemy', 'alembic', 'fastapi', 'torch') if x in sys.modules]; print(heavy)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    proc = subprocess.run([sys.executable, "-m", "kubetune.cli", "server", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "keys" in proc.stdout


def test_a_broken_config_file_is_one_error_naming_its_line(tmp_path):
    """--config is read like a job spec: bad YAML or a repeated key names file:line, never a YAML traceback."""
    from kubetune.errors import SpecError
    from kubetune.server.config import load_config

    bad = tmp_path / "server.yaml"
    bad.write_text("port: 8000\nport: 9000\n")
    with pytest.raises(SpecError, match=rf"{bad}:2: duplicate key 'port' \(first at line 1\)"):
        load_config(bad)
    bad.write_text("models: [\n")
    with pytest.raises(SpecError, match=rf"{bad}:2: not valid YAML"):
        load_config(bad)
