"""``hf://ORG/NAME[@REV][/PATH]`` and ``hf://datasets/ORG/NAME``: the Hugging Face Hub, through
huggingface_hub and its own cache (:mod:`kubetune.storage.hf`)."""

from __future__ import annotations

from pathlib import Path

from ...errors import SourceError
from ...redact import redact_uri
from .._common import TransferStats
from ..location import Location
from . import FETCH, FetchOptions, Scheme, register

__all__ = ["HfScheme"]


class HfScheme(Scheme):
    """The Hub's model, dataset and space repositories (a token comes from the environment only)."""

    names = ("hf",)
    remote = True
    env_credentials = ("organisation", "a Hugging Face token comes from HF_TOKEN or `huggingface-cli login`; see docs/storage.md")
    operations = frozenset({FETCH})

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


register(HfScheme())
