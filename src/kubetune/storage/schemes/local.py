"""Local paths and ``file://``: used in place (copied only into a destination); a local archive is unpacked
once into the cache, keyed by its path, size and time. Also a push destination and an ``output.uri``."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from ...errors import SourceError
from .._common import Progress, TransferStats, check_sha256, copy_tree
from ..location import Location, archive_kind
from . import FETCH, PUSH, SYNC, FetchOptions, OutputTarget, Scheme, register

__all__ = ["LocalScheme"]


class LocalScheme(Scheme):
    """``file:///PATH`` and plain paths (a URI without a scheme parses as ``file``)."""

    names = ("file",)
    operations = frozenset({FETCH, PUSH, SYNC})

    def parse(self, uri: str, scheme: str, rest: str, revision: str | None) -> Location:
        """``file:///PATH``: the path, unquoted (``/`` when empty)."""
        return Location(uri=uri, scheme=scheme, path=unquote(rest) or "/")

    def fetch(self, loc: Location, dest: Path | None, stats: TransferStats, options: FetchOptions) -> Path:
        """The path itself, or a copy in ``dest``; an archive unpacked (into ``dest``, else into the cache)."""
        from .. import archive
        from ..cache import CacheEntry

        path = loc.local_path.absolute()
        if not path.exists():
            raise SourceError(f"{loc.safe}: no such file or directory",
                              hint="check the path (relative paths resolve against the current directory)")
        if options.sha256 and path.is_file():
            check_sha256(path, options.sha256, loc.safe)
        kind = archive_kind(path.name) if path.is_file() else None
        if kind is None:
            if dest is None:
                return path
            copy_tree(path, dest, stats)
            return dest / path.name if path.is_file() else dest
        if dest is not None:
            return archive.unpack_fetched(path, dest, label=loc.uri, stats=stats)
        st = path.stat()  # a local archive is unpacked once into the cache, keyed by path, size and time
        entry = CacheEntry(str(path), f"{st.st_size}:{st.st_mtime_ns}")
        with entry.locked():
            hit = entry.lookup("local") if options.use_cache else None
            if hit is not None:
                stats.cached = True
                return hit
            staging = entry.staging("local")
            try:
                result = archive.unpack_fetched(path, staging / "content", label=loc.uri, stats=stats)
            except BaseException:
                entry.discard(staging)  # nothing to resume: a refused archive leaves the cache as it was
                raise
            return entry.commit(staging, result, "local")

    def push(self, source: Path, loc: Location, stats: TransferStats, progress: Progress, annotations: dict | None) -> dict:
        """Copy into the folder ``loc`` names; a file to the path itself unless it ends with '/' or is a folder."""
        dest = loc.local_path
        if source.is_file() and not loc.path.endswith("/") and not dest.is_dir():
            dest.parent.mkdir(parents=True, exist_ok=True)
            copy_tree(source, dest.parent / ".kubetune-push", stats)
            (dest.parent / ".kubetune-push" / source.name).replace(dest)
            (dest.parent / ".kubetune-push").rmdir()
        else:
            copy_tree(source, dest, stats)
        return {}

    def output_target(self, loc: Location) -> OutputTarget:
        """The run's layout under the folder (see :mod:`kubetune.storage.sync`)."""
        from ..sync_targets import FileStore, PrefixTarget

        return PrefixTarget(loc, FileStore(loc))


register(LocalScheme())
