"""The scheme registry: every scheme module declares what it supports, unknown schemes fail once and clearly,
and a scheme defined here (mem://, in memory) is fetched, pushed and synced through the public API without a
line of fetcher.py, pusher.py or sync_targets.py knowing it: adding a scheme is one module."""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from kt_storage_util import make_tree, read_tree

from kubetune import constants as C
from kubetune.errors import SourceError
from kubetune.storage import OutputSync, fetch, is_remote, parse_uri, push, schemes, uri
from kubetune.storage._common import walk_files
from kubetune.storage.fetcher import fetch_with_stats
from kubetune.storage.location import Location, archive_kind
from kubetune.storage.schemes import DOWNLOAD, FETCH, OPERATIONS, PUSH, SYNC, Scheme

STORAGE = Path(schemes.__file__).resolve().parents[1]
BUILTIN_OPERATIONS = {
    "file": {FETCH, PUSH, SYNC},
    "builtin": {FETCH},
    "hf": {FETCH, PUSH, SYNC},
    "s3": {DOWNLOAD, PUSH, SYNC},
    "http": {DOWNLOAD},
    "https": {DOWNLOAD},
    "oci": {DOWNLOAD, PUSH, SYNC},
    "pvc": {FETCH},  # the kaito flavour's volume: fetching one is a clear error (Kaito mounts it)
}
SUPPORTED = "use a local path, file://, builtin://, hf://, s3://, http(s)://, oci:// or pvc://"


# --- the built-in schemes ---------------------------------------------------------------------------
def test_every_scheme_module_declares_the_operations_it_implements():
    modules = [m.name for m in pkgutil.iter_modules([str(Path(schemes.__file__).parent)])]
    assert sorted(modules) == ["builtin", "hf", "http", "local", "oci", "pvc", "s3"]
    for name in modules:
        module = importlib.import_module(f"kubetune.storage.schemes.{name}")
        defined = [s for s in schemes.registered() if type(s).__module__ == module.__name__]
        assert len(defined) == 1, f"{module.__name__} registers one scheme, found {defined}"
        scheme = defined[0]
        assert scheme.operations and set(scheme.operations) <= set(OPERATIONS), name
        for op, methods in OPERATIONS.items():
            implemented = {m for m in methods if getattr(type(scheme), m) is not getattr(Scheme, m)}
            assert implemented == (set(methods) if op in scheme.operations else set()), (name, op, implemented)
            for m in implemented:
                assert getattr(type(scheme), m).__doc__, f"{name}.{m} has no docstring"
    assert {n: set(schemes.get(n).operations) for n in schemes.names()} == BUILTIN_OPERATIONS


def test_the_registry_is_the_one_list_of_schemes():
    assert schemes.names() == ("file", "builtin", "hf", "s3", "http", "https", "oci", "pvc")
    assert uri.REMOTE_SCHEMES == schemes.names(remote=True) == ("hf", "s3", "http", "https", "oci")
    for name in schemes.names():
        assert is_remote(f"{name}://host/x") == (name in uri.REMOTE_SCHEMES)
    assert schemes.get("https") is schemes.get("http")
    assert [s.display for s in schemes.supporting(PUSH)] == ["hf://", "s3://", "oci://", "file://"]


def test_no_scheme_branches_outside_the_scheme_modules():
    """fetch, push, sync and parsing ask the registry; only schemes/ knows a scheme by name."""
    for name in ("fetcher.py", "pusher.py", "sync.py", "sync_targets.py", "uri.py", "cache.py"):
        text = (STORAGE / name).read_text(encoding="utf-8")
        assert not re.search(r"\.scheme\s*(==|!=|\bin\b|\bnot in\b)", text), name
        assert not re.search(r"scheme\s*(==|in)\s*\(?\s*[\"'](s3|oci|hf|http|https|file|builtin)", text), name


def test_unknown_scheme_is_one_clear_error(tmp_path):
    secret_uri = "gs://bucket/model?X-Goog-Signature=s3cr3t"
    for attempt in (lambda: parse_uri(secret_uri), lambda: fetch(secret_uri), lambda: fetch(secret_uri, tmp_path / "d"),
                    lambda: push(tmp_path, secret_uri), lambda: OutputSync(secret_uri)):
        with pytest.raises(SourceError) as e:
            attempt()
        text = str(e.value)
        assert text.startswith("gs://bucket/model?X-Goog-Signature=") and "unknown URI scheme 'gs://'" in text
        assert "s3cr3t" not in text
        assert e.value.hint == SUPPORTED
    with pytest.raises(SourceError, match=r"^unknown URI scheme 'gs://'") as e:
        schemes.get("gs")
    assert e.value.hint == SUPPORTED


def test_an_operation_a_scheme_lacks_is_named_with_the_ones_that_have_it(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(SourceError, match=r"https://example.com/out: push writes to hf://, s3://, oci:// or file:// URIs"):
        push(tmp_path / "f.txt", "https://example.com/out")
    with pytest.raises(SourceError, match=r"builtin://tiny-chat: output.uri must be hf://, s3://, oci:// or file://"):
        OutputSync("builtin://tiny-chat")


def test_register_refuses_a_scheme_that_misdeclares():
    class PushesNothing(Scheme):
        names = ("kt-a",)
        operations = frozenset({PUSH})

    class SyncsUndeclared(Scheme):
        names = ("kt-b",)
        operations = frozenset({PUSH})

        def push(self, source, loc, stats, progress, annotations):
            """Nowhere."""
            return {}

        def output_target(self, loc):
            """Nowhere."""

    class ProbesOnly(Scheme):
        names = ("kt-c",)
        operations = frozenset({DOWNLOAD})

        def probe(self, loc):
            """Nothing."""

    class Both(Scheme):
        names = ("kt-d",)
        operations = frozenset({FETCH, DOWNLOAD})

    class Clash(Scheme):
        names = ("kt-e", "s3")
        operations = frozenset({FETCH})

        def fetch(self, loc, dest, stats, options):
            """Nothing."""

    for bad, error, message in ((PushesNothing, TypeError, r"declares 'push' but does not implement \['push'\]"),
                                (SyncsUndeclared, TypeError, r"implements \['output_target'\] but does not declare 'sync'"),
                                (ProbesOnly, TypeError, r"declares 'download' but does not implement \['download'\]"),
                                (Both, TypeError, "not both"),
                                (Clash, ValueError, r"'s3://' is registered already")):
        with pytest.raises(error, match=message):
            schemes.register(bad())
    assert "kt-e" not in schemes.names() and schemes.names() == tuple(BUILTIN_OPERATIONS)


# --- a scheme added by a test: mem://BUCKET/PREFIX ----------------------------------------------------
@dataclass
class _Listing:
    prefix: str
    objects: dict[str, bytes]  # relative path -> bytes
    single: bool

    @property
    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for rel, data in sorted(self.objects.items()):
            h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        return "mem:" + h.hexdigest()


class _MemStore:
    """The four operations PrefixTarget needs, over one bucket of the in-memory scheme."""

    def __init__(self, scheme: "MemScheme", loc: Location) -> None:
        self.objects = scheme.buckets.setdefault(loc.host, {})
        self.base = loc.path.strip("/")

    def _key(self, rel: str) -> str:
        return f"{self.base}/{rel}" if self.base else rel

    def list(self, rel_prefix: str) -> list[str]:
        root = self._key("")
        return [k[len(root):] for k in sorted(self.objects) if k.startswith(self._key(rel_prefix))]

    def upload(self, files, last) -> None:
        for path, rel in [*files, *last]:
            self.objects[self._key(rel)] = path.read_bytes()

    def download(self, rel_prefix: str, into: Path) -> None:
        prefix = self._key(rel_prefix)
        make_tree(into, {k[len(prefix):]: v for k, v in self.objects.items() if k.startswith(prefix)})

    def delete(self, rel_prefix: str, first) -> None:
        for k in [self._key(f) for f in first] + [k for k in list(self.objects) if k.startswith(self._key(rel_prefix))]:
            self.objects.pop(k, None)


class MemScheme(Scheme):
    """mem://BUCKET/PREFIX: a dict of buckets; fetched through the cache, pushed to, an output.uri."""

    names = ("mem",)
    remote = True
    operations = frozenset({DOWNLOAD, PUSH, SYNC})

    def __init__(self) -> None:
        self.buckets: dict[str, dict[str, bytes]] = {}
        self.downloads = 0

    def probe(self, loc: Location) -> _Listing:
        """Everything under PREFIX/, else the one object PREFIX."""
        objects = self.buckets.get(loc.host, {})
        prefix = loc.path.rstrip("/") + "/" if loc.path.strip("/") else ""
        found = {k[len(prefix):]: v for k, v in objects.items() if k.startswith(prefix)}
        if found:
            return _Listing(prefix, found, single=False)
        if loc.path in objects:
            return _Listing(loc.path, {loc.basename: objects[loc.path]}, single=True)
        raise SourceError(f"{loc.safe}: nothing there")

    def download(self, loc, remote: _Listing, into: Path, stats, progress, sha256) -> Path:
        """Write the listed objects."""
        self.downloads += 1
        for rel, data in remote.objects.items():
            stats.add(len(data), 1)
        make_tree(into, remote.objects)
        return into / next(iter(remote.objects)) if remote.single else into

    def names_single_archive(self, loc, remote: _Listing) -> bool:
        """One object named like an archive."""
        return remote.single and archive_kind(next(iter(remote.objects))) is not None

    def push(self, source: Path, loc: Location, stats, progress, annotations) -> dict:
        """A folder's files under PREFIX/, a file to PREFIX."""
        bucket = self.buckets.setdefault(loc.host, {})
        pairs = [(source, loc.path)] if source.is_file() else [(p, f"{loc.path.rstrip('/')}/{rel}") for p, rel in walk_files(source)]
        for path, key in pairs:
            bucket[key] = path.read_bytes()
            stats.add(path.stat().st_size, 1)
        return {"objects": len(pairs)}

    def output_target(self, loc: Location):
        """The usual prefix layout, over the in-memory store."""
        from kubetune.storage.sync_targets import PrefixTarget

        return PrefixTarget(loc, _MemStore(self, loc))


@pytest.fixture
def mem(kubetune_home):
    scheme = schemes.register(MemScheme())
    try:
        yield scheme
    finally:
        schemes.unregister("mem")
    assert "mem" not in schemes.names()


def test_a_registered_scheme_is_fetched_through_the_cache(mem, tmp_path, kubetune_home):
    assert "mem" not in (STORAGE / "fetcher.py").read_text(encoding="utf-8")
    files = {"config.json": b"{}", "weights/a.bin": b"A" * 1000}
    mem.buckets["bkt"] = {f"models/m/{k}": v for k, v in files.items()}
    assert is_remote("mem://bkt/models/m") and "mem" in uri.REMOTE_SCHEMES
    assert parse_uri("mem://bkt/models/m") == Location("mem://bkt/models/m", "mem", "bkt", "models/m")

    first, stats = fetch_with_stats("mem://bkt/models/m")
    assert read_tree(first) == files and str(first).startswith(str(kubetune_home))
    assert (stats.files, stats.bytes, stats.cached) == (2, 1002, False)
    again, stats = fetch_with_stats("mem://bkt/models/m")
    assert again == first and stats.cached and mem.downloads == 1  # the fingerprint matched: nothing moved

    mem.buckets["bkt"]["models/m/config.json"] = b'{"v": 2}'  # a new version: a new fingerprint
    assert read_tree(fetch("mem://bkt/models/m"))["config.json"] == b'{"v": 2}' and mem.downloads == 2
    assert read_tree(fetch("mem://bkt/models/m", use_cache=False))["config.json"] == b'{"v": 2}' and mem.downloads == 3

    out = fetch("mem://bkt/models/m", tmp_path / "dest")
    assert out == tmp_path / "dest" and read_tree(out)["weights/a.bin"] == b"A" * 1000

    single = fetch("mem://bkt/models/m/config.json", sha256=hashlib.sha256(b'{"v": 2}').hexdigest())
    assert single.name == "config.json" and single.read_bytes() == b'{"v": 2}'
    with pytest.raises(SourceError, match="mem://bkt/models/m/config.json: sha256 mismatch"):
        fetch("mem://bkt/models/m/config.json", tmp_path / "d2", sha256="0" * 64)
    with pytest.raises(SourceError, match=r"its credentials were masked \(\*\*\*\)"):
        fetch("mem://user:***@bkt/models/m")


def test_a_registered_scheme_is_pushed_to_and_its_archives_unpacked(mem, tmp_path):
    src = make_tree(tmp_path / "outer" / "model", {"config.json": b"{}", "sub/w.bin": b"W" * 10})
    summary = push(src, "mem://bkt/up")
    assert summary["files"] == 2 and summary["objects"] == 2  # the scheme's own summary fields come through
    assert sorted(mem.buckets["bkt"]) == ["up/config.json", "up/sub/w.bin"]

    push(tmp_path / "outer", "mem://bkt/packed/model.tar.gz", tar=True)  # the URI names the archive: Scheme.archive_name
    assert list(mem.buckets["bkt"])[-1] == "packed/model.tar.gz"
    out = fetch("mem://bkt/packed/model.tar.gz", tmp_path / "unpacked")
    assert out == tmp_path / "unpacked" / "model" and read_tree(out) == read_tree(src)  # the archive's one folder
    assert not (tmp_path / "unpacked" / ".kubetune-download").exists()


def test_a_registered_scheme_is_an_output_uri(mem, tmp_path):
    run = make_tree(tmp_path / "run", {"adapter/adapter_model.safetensors": b"A" * 64, C.RESULT_FILE: b'{"loss": 1}'})
    ckpt = make_tree(run / C.CHECKPOINTS_DIR / "checkpoint-3", {"optimizer.pt": b"O" * 32, C.CHECKPOINT_COMPLETE: b"ok"})
    sync = OutputSync("mem://out/exp1", keep=1)
    sync.checkpoint_saved(ckpt)
    assert sync.wait(30) and sync.synced == ["checkpoint-3"] and not sync.errors
    sync.publish(run)
    sync.close()
    keys = mem.buckets["out"]
    assert keys["exp1/adapter/adapter_model.safetensors"] == b"A" * 64 and json.loads(keys[f"exp1/{C.RESULT_FILE}"]) == {"loss": 1}
    assert f"exp1/{C.CHECKPOINTS_DIR}/checkpoint-3/{C.CHECKPOINT_COMPLETE}" in keys and f"exp1/{C.DONE_FILE}" in keys

    pulled = OutputSync("mem://out/exp1").pull_latest_checkpoint(tmp_path / "resume")
    assert pulled == tmp_path / "resume" / "checkpoint-3" and (pulled / "optimizer.pt").read_bytes() == b"O" * 32


def test_an_unregistered_scheme_is_unknown_again(kubetune_home):
    scheme = schemes.register(MemScheme())
    schemes.unregister("mem")
    assert scheme not in schemes.registered()
    with pytest.raises(SourceError, match="unknown URI scheme 'mem://'"):
        parse_uri("mem://bkt/x")
    assert not is_remote("mem://bkt/x")
