"""``oci://REGISTRY/REPO:TAG`` (or ``@sha256:...``): an OCI artifact, one layer per file titled with its path,
or a container image's ``/data`` (:mod:`kubetune.storage.oci`). Fetched through the cache (the manifest
digest is the fingerprint), pushed to, and an ``output.uri`` (one tag per artifact)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from ... import constants as C
from ...errors import SourceError
from ...redact import redact_uri
from .._common import Progress, TransferStats, walk_files
from ..location import Location, archive_kind
from . import DOWNLOAD, PUSH, SYNC, OutputTarget, Remote, Scheme, register

__all__ = ["OciScheme"]


class OciScheme(Scheme):
    """OCI registries (Docker Hub, GHCR, Harbor, Zot, distribution); logins come from the environment."""

    names = ("oci",)
    remote = True
    env_credentials = ("registry", "registry logins come from KUBETUNE_REGISTRY_USERNAME/PASSWORD or the docker config; "
                       "see docs/storage.md")
    operations = frozenset({DOWNLOAD, PUSH, SYNC})

    def parse(self, uri: str, scheme: str, rest: str, revision: str | None) -> Location:
        """``oci://REGISTRY/REPOSITORY[:TAG|@DIGEST]``: the registry is the host, the rest the path."""
        registry, _, repo = rest.partition("/")
        if not registry or not repo:
            raise SourceError(f"{redact_uri(uri)}: expected oci://REGISTRY/REPOSITORY[:TAG|@DIGEST]")
        return Location(uri=uri, scheme=scheme, host=registry, path=repo)

    def probe(self, loc: Location) -> Remote:
        """The manifest (an index picks this machine's platform)."""
        from .. import oci

        return oci.probe(loc)

    def download(self, loc: Location, remote: Any, into: Path, stats: TransferStats, progress: Progress,
                 sha256: str | None) -> Path:
        """The artifact's titled layers, or an image's files under ``/data``, each blob checked against its digest."""
        from .. import oci

        return oci.download(loc, remote, into, stats, progress)

    def push(self, source: Path, loc: Location, stats: TransferStats, progress: Progress, annotations: dict | None) -> dict:
        """One artifact, one layer per file (a .tar.gz as such); the tag is written last. Returns its ``digest``."""
        from .. import oci

        if source.is_file():
            gzipped = archive_kind(source.name) == "tar" and source.name.endswith(("gz", "tgz"))
            files = [(source, source.name, C.OCI_MEDIA_TAR_GZIP if gzipped else C.OCI_MEDIA_FILE)]
        else:
            files = [(p, rel, C.OCI_MEDIA_FILE) for p, rel in walk_files(source)]
            if not files:
                raise SourceError(f"{source}: the folder is empty; nothing to push")
        notes = {C.OCI_ANNOTATION_CREATED: _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                 **{str(k): str(v) for k, v in (annotations or {}).items()}}
        return {"digest": oci.push_files(loc, files, stats, progress, annotations=notes)}

    def archive_name(self, loc: Location) -> str | None:
        """Never the URI's: its last segment is ``REPO:TAG`` (``push --tar`` names the layer ``NAME.tar.gz``)."""
        return None

    def output_target(self, loc: Location) -> OutputTarget:
        """Tags of the repository: TAG, TAG-merged, TAG-run, TAG-checkpoint-N (see :mod:`kubetune.storage.sync`)."""
        from ..sync_targets import OciTarget

        return OciTarget(loc)


register(OciScheme())
