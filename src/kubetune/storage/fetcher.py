"""fetch: any model/dataset URI to a local path, through the cache, with archives unpacked safely.

The story of one fetch: parse the URI; local paths and builtin models need no transfer; hf:// goes to
huggingface_hub; s3/http(s)/oci are probed first (listing, HEAD, manifest) which yields a
fingerprint. Without a destination the fingerprint selects a cache entry: a match returns at once,
a miss downloads into the entry's staging folder and commits it. With a destination the files go
there directly, skipping those already present and verified. A single archive is then unpacked.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from .. import constants as C
from ..errors import SourceError
from ..redact import is_redacted
from . import archive
from ._common import Progress, TransferStats, copy_tree, file_digest, log, missing_dirs, remove_empty_dirs
from .cache import CacheEntry
from .uri import REMOTE_SCHEMES, Location, archive_kind, parse_uri

__all__ = ["fetch_with_stats"]

_DOWNLOAD_DIR = ".kubetune-download"


def fetch_with_stats(
    uri: str | Path,
    dest: str | Path | None = None,
    *,
    revision: str | None = None,
    use_cache: bool = True,
    progress: bool = False,
    sha256: str | None = None,
    allow_patterns: list[str] | None = None,
    ignore_patterns: list[str] | None = None,
) -> tuple[Path, TransferStats]:
    """:func:`kubetune.storage.fetch`, also returning what was transferred (for the CLI's summary)."""
    loc = parse_uri(uri, revision)
    if loc.scheme in REMOTE_SCHEMES and is_redacted(loc.uri):
        raise SourceError(
            f"{loc.safe}: its credentials were masked (***) where kubetune saved or showed it, so it cannot be fetched",
            hint="kubetune never stores credentials: give the URI with them again, or use credentials from the environment "
            "(docs/storage.md#credentials)",
        )
    sha256 = _expected_digest(loc, sha256)
    stats = TransferStats(uri=loc.safe)
    target = Path(dest).expanduser().absolute() if dest is not None else None
    if loc.scheme == "file":
        result = _fetch_local(loc, target, stats, sha256=sha256, use_cache=use_cache)
    elif loc.scheme == C.BUILTIN_SCHEME:
        from ..training.builtin import materialize

        result = materialize(loc.host)
        if target is not None:
            copy_tree(result, target, stats)
            result = target
    elif loc.scheme == "hf":
        from . import hf

        result = hf.download(loc, target, stats, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns, progress=progress)
    else:
        with Progress(f"fetch {loc.safe}", enabled=progress) as bar:
            result = _fetch_remote(loc, target, stats, bar, sha256=sha256, use_cache=use_cache)
    stats.finish()
    log.info("fetched %s -> %s (%s, %.1fs%s)", loc.safe, result, stats.describe(), stats.seconds, ", cached" if stats.cached else "")
    return result, stats


def _expected_digest(loc: Location, sha256: str | None) -> str | None:
    """The digest to verify: the argument, or an http(s) URI's ``#sha256=HEX`` fragment (usable in a job spec)."""
    if loc.scheme not in ("http", "https"):
        return sha256
    frag = urlsplit(loc.uri).fragment
    if not frag:
        return sha256
    key, _, value = frag.partition("=")
    value = value.strip().lower().removeprefix("sha256:")
    if key.strip().lower() != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise SourceError(f"{loc.safe}: unsupported URI fragment '#{frag}'", hint="the only fragment kubetune reads is #sha256=<64 hex digits>")
    if sha256 and sha256.lower().removeprefix("sha256:") != value:
        raise SourceError(f"{loc.safe}: the URI's #sha256 and the sha256 given disagree", hint="give the digest once")
    return value


# --- local paths -----------------------------------------------------------------------------
def _fetch_local(loc: Location, dest: Path | None, stats: TransferStats, *, sha256: str | None, use_cache: bool) -> Path:
    path = loc.local_path.absolute()
    if not path.exists():
        raise SourceError(f"{loc.safe}: no such file or directory",
                          hint="check the path (relative paths resolve against the current directory)")
    if sha256 and path.is_file():
        _check_sha256(path, sha256, loc)
    kind = archive_kind(path.name) if path.is_file() else None
    if kind is None:
        if dest is None:
            return path
        copy_tree(path, dest, stats)
        return dest / path.name if path.is_file() else dest
    if dest is not None:
        return _unpack_into(path, dest, loc, stats)
    st = path.stat()  # a local archive is unpacked once into the cache, keyed by path, size and time
    entry = CacheEntry(str(path), f"{st.st_size}:{st.st_mtime_ns}")
    with entry.locked():
        hit = entry.lookup("local") if use_cache else None
        if hit is not None:
            stats.cached = True
            return hit
        staging = entry.staging("local")
        try:
            result = _unpack_into(path, staging / "content", loc, stats)
        except BaseException:
            entry.discard(staging)  # nothing to resume: a refused archive leaves the cache as it was
            raise
        return entry.commit(staging, result, "local")


# --- remote URIs -----------------------------------------------------------------------------
def _probe(loc: Location):
    if loc.scheme == "s3":
        from . import s3

        return s3.probe(loc)
    if loc.scheme in ("http", "https"):
        from . import web

        return web.probe(loc)
    if loc.scheme == "oci":
        from . import oci

        return oci.probe(loc)
    raise SourceError(f"{loc.safe}: cannot fetch '{loc.scheme}://' URIs")


def _download(loc: Location, remote, into: Path, stats: TransferStats, bar: Progress, sha256: str | None) -> Path:
    if loc.scheme == "s3":
        from . import s3

        return s3.download(remote, loc, into, stats, bar)
    if loc.scheme in ("http", "https"):
        from . import web

        return web.download(loc, into, stats, bar, remote=remote, sha256=sha256)
    from . import oci

    return oci.download(loc, remote, into, stats, bar)


def _fetch_remote(loc: Location, dest: Path | None, stats: TransferStats, bar: Progress, *,
                  sha256: str | None, use_cache: bool) -> Path:
    remote = _probe(loc)
    fingerprint = remote.fingerprint
    if sha256 and loc.scheme in ("http", "https"):
        fingerprint = f"sha256:{sha256.lower().removeprefix('sha256:')}"  # content-addressed: the best key
    if dest is None:
        entry = CacheEntry(loc.uri, loc.revision)
        with entry.locked():
            hit = entry.lookup(fingerprint) if use_cache else None
            if hit is not None:
                if sha256 and hit.is_file():
                    _check_sha256(hit, sha256, loc)
                stats.cached = True
                stats.skipped_bytes = _size(hit)
                log.info("%s: cache hit (%s)", loc.safe, hit)
                return hit
            staging = entry.staging(fingerprint)
            try:
                result = _materialize(loc, remote, staging, stats, bar, sha256)
            except archive.ArchiveError:
                entry.discard(staging)  # a refused archive is not resumed: the cache stays as it was
                raise
            return entry.commit(staging, result, fingerprint)
    made = missing_dirs(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        return _materialize(loc, remote, dest, stats, bar, sha256)
    except archive.ArchiveError:
        remove_empty_dirs(made)  # a refused archive leaves no trace: dest stays as it was
        raise


def _materialize(loc: Location, remote, into: Path, stats: TransferStats, bar: Progress, sha256: str | None) -> Path:
    """Download into ``into``; a single archive is downloaded aside and unpacked into ``into``."""
    single_archive = _names_single_archive(loc, remote)
    where = into / _DOWNLOAD_DIR if single_archive else into
    result = _download(loc, remote, where, stats, bar, sha256)
    if sha256 and loc.scheme not in ("http", "https"):
        if not result.is_file():
            raise SourceError(f"{loc.safe}: sha256 was given but the URI names a folder", hint="give sha256 for single files only")
        _check_sha256(result, sha256, loc)
    if result.is_file() and archive_kind(result.name):
        if not single_archive:  # learnt only after the download (an OCI artifact with one layer)
            moved = into / _DOWNLOAD_DIR / result.name
            moved.parent.mkdir(parents=True, exist_ok=True)
            result.replace(moved)
            result = moved
        try:
            out = _unpack_into(result, into, loc, stats)
        except archive.ArchiveError:
            shutil.rmtree(into / _DOWNLOAD_DIR, ignore_errors=True)  # refused: nothing of it is kept
            raise
        shutil.rmtree(into / _DOWNLOAD_DIR, ignore_errors=True)
        return out
    return result


def _names_single_archive(loc: Location, remote) -> bool:
    if loc.scheme == "s3":
        return remote.single and archive_kind(remote.objects[0].rel) is not None
    if loc.scheme in ("http", "https"):
        return archive_kind(loc.basename) is not None
    return False


def _unpack_into(archive_file: Path, dest: Path, loc: Location, stats: TransferStats) -> Path:
    """Unpack safely into ``dest`` (all or nothing: a refused archive leaves ``dest`` as it was), counting what it
    put there in ``stats``.

    Returns ``dest``, or the one folder the archive holds when it holds exactly one (``model/``).
    """
    names = archive.unpack_members(archive_file, dest, label=loc.uri, stats=stats)
    if len(names) == 1 and (dest / names[0]).is_dir() and not (dest / names[0]).is_symlink():
        return dest / names[0]
    return dest


def _check_sha256(path: Path, expected: str, loc: Location) -> None:
    want = expected.lower().removeprefix("sha256:")
    got = file_digest(path)
    if got != want:
        raise SourceError(f"{loc.safe}: sha256 mismatch: expected {want}, got {got}",
                          hint="the file changed or was corrupted; check the URI and the expected digest")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
