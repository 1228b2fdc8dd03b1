"""CLI commands of storage: ``kubetune fetch URI DEST`` (what init containers run) and ``kubetune push SRC URI``.

Both show a progress bar on stderr and end with one summary line: bytes, files, time and throughput.
Imports stay light: boto3, huggingface_hub and oras load only when a command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

__all__ = ["register"]


class RichTransferBar:
    """A transfer's progress as a rich bar on stderr (what ``--progress`` shows in a terminal)."""

    def __init__(self, label: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                             TimeRemainingColumn(), console=Console(stderr=True), transient=False)
        self._bar.start()
        self._task = self._bar.add_task(label, total=0)

    def update(self, done: int, total: int) -> None:
        """Show ``done`` of ``total`` bytes."""
        self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        """Stop the bar."""
        self._bar.stop()


def register(app: typer.Typer) -> None:
    """Add ``fetch`` and ``push`` to the main ``kubetune`` app; transfers in this process show rich bars."""
    from ..storage._common import set_progress_display

    set_progress_display(RichTransferBar)
    app.command("fetch")(fetch)
    app.command("push")(push)


def fetch(
    uri: str = typer.Argument(..., help="Model or dataset URI: path, file://, builtin://, hf://, s3://, http(s)://, oci://."),
    dest: Path = typer.Argument(..., help="Directory to put the files in (created)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="hf:// revision (branch, tag or commit)."),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="Expected sha256 of a single-file source."),
    include: List[str] = typer.Option([], "--include", help="hf:// only these files (glob, repeatable)."),
    exclude: List[str] = typer.Option([], "--exclude", help="hf:// not these files (glob, repeatable)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Download a model or dataset into DEST (archives are unpacked safely); prints the local path."""
    from ..storage.fetcher import fetch_with_stats

    path, stats = fetch_with_stats(
        uri, dest, revision=revision, sha256=sha256, progress=not quiet,
        allow_patterns=include or None, ignore_patterns=exclude or None,
    )
    s = stats.summary()
    note = f", {_human(s['skipped_bytes'])} already there" if s["skipped_bytes"] else ""
    _summary(f"fetched {s['uri']} -> {path}", s, note)
    typer.echo(str(path))


def push(
    src: Path = typer.Argument(..., help="File or directory to upload."),
    uri: str = typer.Argument(..., help="Destination: s3://BUCKET/PREFIX, oci://REGISTRY/REPO:TAG, hf://ORG/NAME[@BRANCH][/DIR] or file:///PATH."),
    tar: bool = typer.Option(False, "--tar", help="Pack SRC into one NAME.tar.gz first (fetch unpacks it)."),
    annotation: List[str] = typer.Option([], "--annotation", "-a", help="KEY=VALUE: OCI manifest annotation or S3 metadata (repeatable)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Upload a model or dataset to a bucket or registry (deliver it before training)."""
    from ..errors import SourceError
    from ..storage.pusher import push_with_stats

    notes = {}
    for item in annotation:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SourceError(f"--annotation '{item}': expected KEY=VALUE, e.g. org.opencontainers.image.description=tiny")
        notes[key.strip()] = value
    s = push_with_stats(src, uri, tar=tar, annotations=notes or None, progress=not quiet)
    note = f", {_human(s['skipped_bytes'])} already there" if s["skipped_bytes"] else ""
    note += f", digest {s['digest']}" if s.get("digest") else ""
    _summary(f"pushed {src} -> {s['uri']}", s, note)


def _summary(head: str, s: dict, note: str) -> None:
    unpacked = s.get("unpacked_files") or 0
    bits = [f"{_human(s['bytes'])} in {s['files']} file(s)"] if s["bytes"] or s["files"] or not unpacked else []
    if unpacked:  # a local archive moves nothing but is unpacked: say what it put in place
        bits.append(f"unpacked {unpacked} file(s), {_human(s.get('unpacked_bytes') or 0)}")
    bits.append(f"{s['seconds']:.1f}s")
    if s["bytes"]:
        bits.append(f"{_human(s['bytes_per_second'])}/s" if s["seconds"] > 0 else "instant")
    elif not unpacked:
        bits.append("nothing to transfer")
    cached = " (cache hit)" if s.get("cached") else ""
    typer.echo(f"{head}{cached}: {', '.join(bits)}{note}", err=True)


def _human(n: float) -> str:
    from ..storage._common import human_bytes

    return human_bytes(n)
