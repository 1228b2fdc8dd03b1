"""``pvc://CLAIM``: a Kubernetes PersistentVolumeClaim, read and written by Kaito (``kubernetes.flavor: kaito``) as its
tuning Workspace's ``volumeSource`` input and output. Nothing else in kubetune reaches a claim by URI: fetching one
is a clear error naming the field's alternatives (the kaito render never fetches it)."""

from __future__ import annotations

from pathlib import Path

from ... import constants as C
from ...errors import SourceError
from .._common import TransferStats
from ..location import Location
from . import FETCH, FetchOptions, Scheme, register

__all__ = ["PvcScheme", "claim_of"]


def claim_of(uri: str) -> tuple[str, str]:
    """``pvc://CLAIM[/PATH]`` -> (claim, path without slashes at either end)."""
    rest = uri.split("://", 1)[1]
    claim, _, path = rest.partition("/")
    return claim, path.strip("/")


class PvcScheme(Scheme):
    """``pvc://CLAIM``: Kaito's volume input and output only."""

    names = (C.PVC_SCHEME,)
    operations = frozenset({FETCH})

    def parse(self, uri: str, scheme: str, rest: str, revision: str | None) -> Location:
        """``pvc://CLAIM[/PATH]``: the claim is the host."""
        claim, path = claim_of(uri)
        return Location(uri=uri, scheme=scheme, host=claim, path=path)

    def fetch(self, loc: Location, dest: Path | None, stats: TransferStats, options: FetchOptions) -> Path:
        """Refused: a claim is mounted by Kaito's pods, never fetched by kubetune."""
        raise SourceError(
            f"{loc.uri}: a PersistentVolumeClaim is read only by Kaito (kubernetes.flavor: kaito mounts it as the Workspace's volume)",
            hint="on other backends and flavours name the data by s3://, https://, oci:// or hf://, or copy it there with kubetune deliver",
        )


register(PvcScheme())
