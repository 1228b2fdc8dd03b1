"""fetch: any model/dataset URI to a local path, through the cache, with archives unpacked safely.

The story of one fetch: parse the URI and ask the scheme registry (:mod:`.schemes`) for its scheme. A
scheme that fetches by itself (local paths, builtin models, hf:// through huggingface_hub) does so. The
others (s3, http(s), oci) are probed first (listing, HEAD, manifest), which yields a fingerprint. Without
a destination the fingerprint selects a cache entry: a match returns at once, a miss downloads into the
entry's staging folder and commits it. With a destination the files go there directly, skipping those
already present and verified. A single archive is then unpacked.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import SourceError
from ..redact import is_redacted
from . import archive, schemes
from ._common import Progress, TransferStats, check_sha256, log, missing_dirs, remove_empty_dirs
from .cache import CacheEntry
from .location import Location, archive_kind
from .schemes import DOWNLOAD, FETCH, FetchOptions, Scheme
from .uri import parse_uri

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
    scheme = schemes.get(loc.scheme, loc.uri)
    if scheme.remote and is_redacted(loc.uri):
        raise SourceError(
            f"{loc.safe}: its credentials were masked (***) where kubetune saved or showed it, so it cannot be fetched",
            hint="kubetune never stores credentials: give the URI with them again, or use credentials from the environment "
            "(docs/storage.md#credentials)",
        )
    sha256 = scheme.expected_digest(loc, sha256)
    stats = TransferStats(uri=loc.safe)
    target = Path(dest).expanduser().absolute() if dest is not None else None
    if scheme.supports(FETCH):
        options = FetchOptions(sha256=sha256, use_cache=use_cache, progress=progress,
                               allow_patterns=allow_patterns, ignore_patterns=ignore_patterns)
        result = scheme.fetch(loc, target, stats, options)
    else:
        with Progress(f"fetch {loc.safe}", enabled=progress) as bar:
            result = _fetch_remote(scheme, loc, target, stats, bar, sha256=sha256, use_cache=use_cache)
    stats.finish()
    log.info("fetched %s -> %s (%s, %.1fs%s)", loc.safe, result, stats.describe(), stats.seconds, ", cached" if stats.cached else "")
    return result, stats


# --- through the cache (schemes with probe + download) ----------------------------------------
def _fetch_remote(scheme: Scheme, loc: Location, dest: Path | None, stats: TransferStats, bar: Progress, *,
                  sha256: str | None, use_cache: bool) -> Path:
    if not scheme.supports(DOWNLOAD):
        raise SourceError(f"{loc.safe}: cannot fetch '{loc.scheme}://' URIs")
    remote = scheme.probe(loc)
    fingerprint = remote.fingerprint
    if sha256 and scheme.content_addressed:
        fingerprint = f"sha256:{sha256.lower().removeprefix('sha256:')}"  # content-addressed: the best key
    if dest is None:
        entry = CacheEntry(loc.uri, loc.revision)
        with entry.locked():
            hit = entry.lookup(fingerprint) if use_cache else None
            if hit is not None:
                if sha256 and hit.is_file():
                    check_sha256(hit, sha256, loc.safe)
                stats.cached = True
                stats.skipped_bytes = _size(hit)
                log.info("%s: cache hit (%s)", loc.safe, hit)
                return hit
            staging = entry.staging(fingerprint)
            try:
                result = _materialize(scheme, loc, remote, staging, stats, bar, sha256)
            except archive.ArchiveError:
                entry.discard(staging)  # a refused archive is not resumed: the cache stays as it was
                raise
            return entry.commit(staging, result, fingerprint)
    made = missing_dirs(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        return _materialize(scheme, loc, remote, dest, stats, bar, sha256)
    except archive.ArchiveError:
        remove_empty_dirs(made)  # a refused archive leaves no trace: dest stays as it was
        raise


def _materialize(scheme: Scheme, loc: Location, remote, into: Path, stats: TransferStats, bar: Progress,
                 sha256: str | None) -> Path:
    """Download into ``into``; a single archive is downloaded aside and unpacked into ``into``."""
    single_archive = scheme.names_single_archive(loc, remote)
    where = into / _DOWNLOAD_DIR if single_archive else into
    result = scheme.download(loc, remote, where, stats, bar, sha256)
    if sha256 and not scheme.content_addressed:  # a content-addressed scheme checked it while downloading
        if not result.is_file():
            raise SourceError(f"{loc.safe}: sha256 was given but the URI names a folder", hint="give sha256 for single files only")
        check_sha256(result, sha256, loc.safe)
    if result.is_file() and archive_kind(result.name):
        if not single_archive:  # learnt only after the download (an OCI artifact with one layer)
            moved = into / _DOWNLOAD_DIR / result.name
            moved.parent.mkdir(parents=True, exist_ok=True)
            result.replace(moved)
            result = moved
        try:
            out = archive.unpack_fetched(result, into, label=loc.uri, stats=stats)
        except archive.ArchiveError:
            shutil.rmtree(into / _DOWNLOAD_DIR, ignore_errors=True)  # refused: nothing of it is kept
            raise
        shutil.rmtree(into / _DOWNLOAD_DIR, ignore_errors=True)
        return out
    return result


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
