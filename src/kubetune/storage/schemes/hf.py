"""``hf://ORG/NAME[@REV][/PATH]`` and ``hf://datasets/ORG/NAME``: the Hugging Face Hub, through
huggingface_hub and its own cache (:mod:`kubetune.storage.hf`); pushes and ``output.uri`` as commits
(:mod:`kubetune.storage.hf_push`)."""

from __future__ import annotations

from pathlib import Path

from ...errors import SourceError
from ...redact import redact_uri
from .._common import Progress, TransferStats, walk_files
from ..location import Location
from . import FETCH, PUSH, SYNC, FetchOptions, OutputTarget, Scheme, register

__all__ = ["HfScheme"]


class HfScheme(Scheme):
    """The Hub's model, dataset and space repositories (a token comes from the environment only)."""

    names = ("hf",)
    remote = True
    env_credentials = ("organisation", "a Hugging Face token comes from HF_TOKEN or `huggingface-cli login`; see docs/storage.md")
    operations = frozenset({FETCH, PUSH, SYNC})

    def parse(self, uri: str, scheme: str, rest: str, revision: str | None) -> Location:
        """``[datasets/|models/|spaces/]ORG/NAME[@REVISION][/PATH]``; ``revision`` wins over ``@REVISION``."""
        repo_type = "model"
        for prefix, kind in (("datasets/", "dataset"), ("models/", "model"), ("spaces/", "space")):
            if rest.startswith(prefix):
                repo_type, rest = kind, rest[len(prefix):]
                break
        segments = rest.strip("/").split("/")
        if len(segments) < 2 or not segments[0]:
            raise SourceError(f"{redact_uri(uri)}: expected hf://ORG/NAME[@REVISION][/PATH] (or hf://datasets/ORG/NAME)")
        org, name = segments[0], segments[1]
        sub = "/".join(segments[2:])
        rev = None
        if "@" in name:
            name, _, rev = name.partition("@")
        return Location(
            uri=uri, scheme="hf", host=f"{org}/{name}", path=sub, revision=revision or rev or None, repo_type=repo_type
        )

    def fetch(self, loc: Location, dest: Path | None, stats: TransferStats, options: FetchOptions) -> Path:
        """A snapshot in the Hub's cache (or in ``dest``), filtered by the allow/ignore patterns."""
        from .. import hf

        return hf.download(loc, dest, stats, allow_patterns=options.allow_patterns,
                           ignore_patterns=options.ignore_patterns, progress=options.progress)

    def push(self, source: Path, loc: Location, stats: TransferStats, progress: Progress, annotations: dict | None) -> dict:
        """A file or folder as one commit (the repository is created private when missing); ``commit_url`` in the summary."""
        from .. import hf_push

        if source.is_dir() and not any(True for _ in walk_files(source)):
            raise SourceError(f"{source}: the folder is empty; nothing to push")
        url = hf_push.push_path(source, loc)
        files = [source] if source.is_file() else [p for p, _ in walk_files(source)]
        stats.add(sum(p.stat().st_size for p in files), len(files))
        return {"commit_url": url}

    def output_target(self, loc: Location) -> OutputTarget:
        """Checkpoints and results as commits of one model repository (layout: :mod:`kubetune.storage.hf_push`)."""
        from ..hf_push import HfTarget

        return HfTarget(loc)


register(HfScheme())
