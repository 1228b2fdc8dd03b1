"""hf:// sources: the Hugging Face Hub through huggingface_hub's snapshot_download.

The Hub's own cache is used (``HF_HUB_CACHE``/``HF_HOME``), so models already downloaded by any
Hugging Face tool are reused, ``HF_HUB_OFFLINE=1`` works from that cache, and ``HF_TOKEN`` is read
by huggingface_hub itself (kubetune never sees or logs it). With a destination, files are written
there directly (``local_dir``); offline, they are copied from the cache.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .. import constants as C
from ..errors import SourceError
from ._common import TransferStats, concurrency, walk_files
from .uri import Location, scrub

__all__ = ["download"]


def download(
    loc: Location,
    dest: Path | None,
    stats: TransferStats,
    *,
    allow_patterns: list[str] | None = None,
    ignore_patterns: list[str] | None = None,
    progress: bool = False,
) -> Path:
    # progress: huggingface_hub draws its own bars (HF_HUB_DISABLE_PROGRESS_BARS=1 hides them).
    """Snapshot ``loc`` (a repo, or a file/folder in it) and return the local path.

    Raises:
        SourceError: repo or revision not found, gated or private without a token, offline without a cache.
    """
    from huggingface_hub import constants as hf_constants
    from huggingface_hub import snapshot_download

    allow = list(allow_patterns) if allow_patterns else None
    if loc.path:  # hf://org/name/sub/file.json: only that file or folder
        allow = [loc.path, f"{loc.path}/*"] + (allow or [])
    kwargs = dict(
        repo_id=loc.host,
        repo_type=loc.repo_type,
        revision=loc.revision,
        allow_patterns=allow,
        ignore_patterns=list(ignore_patterns) if ignore_patterns else None,
        max_workers=concurrency(),
        library_name="kubetune",
    )
    offline = bool(getattr(hf_constants, "HF_HUB_OFFLINE", False))
    try:
        if dest is not None and not offline:
            path = Path(snapshot_download(local_dir=str(dest), **kwargs))
        else:
            path = Path(snapshot_download(**kwargs))
            if dest is not None:  # offline: from the cache, honouring the patterns (the cache may hold more)
                _copy_filtered(path, dest, allow, kwargs["ignore_patterns"], stats)
                path = dest
    except Exception as e:  # huggingface_hub's error classes vary between versions: map by name
        raise _map_error(e, loc, offline) from None
    if dest is None or not offline:  # bytes huggingface_hub placed (cache hits included: it does not say)
        for p, _ in walk_files(path):
            stats.add(p.stat().st_size, 1)
    result = path / loc.path if loc.path else path
    if not result.exists():
        raise SourceError(f"{loc.safe}: '{loc.path}' is not in the repository", hint="check the path after ORG/NAME")
    return result


def _copy_filtered(src: Path, dest: Path, allow: list[str] | None, ignore: list[str] | None, stats: TransferStats) -> None:
    from huggingface_hub.utils import filter_repo_objects

    files = dict((rel, p) for p, rel in walk_files(src))
    for rel in filter_repo_objects(items=list(files), allow_patterns=allow, ignore_patterns=ignore):
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files[rel], out)
        stats.add(out.stat().st_size, 1)


def _map_error(e: Exception, loc: Location, offline: bool) -> SourceError:
    name = type(e).__name__
    token_hint = f"set {C.ENV_HF_TOKEN} to a token that can read it (huggingface.co/settings/tokens)"
    if name == "GatedRepoError":
        return SourceError(f"{loc.safe}: the repository is gated", hint=f"accept its conditions on the Hub, then {token_hint}")
    if name == "RepositoryNotFoundError":
        return SourceError(f"{loc.safe}: repository not found (or private)", hint=f"check ORG/NAME; for a private repo {token_hint}")
    if name == "RevisionNotFoundError":
        return SourceError(f"{loc.safe}: revision '{loc.revision}' not found", hint="use a branch, tag or commit that exists")
    if name in ("LocalEntryNotFoundError", "IncompleteSnapshotError", "OfflineModeIsEnabled"):
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        return SourceError(
            f"{loc.safe}: {why} and the files are not in the local cache",
            hint="download it once with network access (HF_HUB_CACHE/HF_HOME pick the cache), or unset HF_HUB_OFFLINE; "
            "HF_ENDPOINT selects a mirror",
        )
    if name in ("HfHubHTTPError",) and "401" in str(e):
        return SourceError(f"{loc.safe}: access denied by the Hub", hint=token_hint)
    return SourceError(f"{loc.safe}: {name}: {scrub(e)}")
