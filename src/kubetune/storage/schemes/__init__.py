"""The storage schemes: one :class:`Scheme` per URI scheme, and the one registry that fetch, push,
OutputSync and URI parsing ask.

A scheme module (``schemes/s3.py`` and its siblings) subclasses :class:`Scheme`, says which operations
it supports in ``operations`` and implements exactly those methods, then calls :func:`register`. The
built-in modules are imported (and so registered) by :mod:`kubetune.storage` itself; each imports its
transport (boto3, httpx, huggingface_hub, oras) only inside the methods that use it.

The operations:

* ``FETCH``: :meth:`Scheme.fetch` materialises a URI by itself (local paths, ``builtin://``, ``hf://``).
* ``DOWNLOAD``: :meth:`Scheme.probe` + :meth:`Scheme.download`: fetch runs them through the cache (the
  probe's fingerprint is the cache key) and unpacks a single archive (s3, http(s), oci).
* ``PUSH``: :meth:`Scheme.push` uploads a file or folder (``kubetune push``).
* ``SYNC``: :meth:`Scheme.output_target` gives :class:`kubetune.storage.OutputSync` where to write
  (``output.uri``).

See docs/architecture.md, "How to add a storage scheme".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from ...errors import SourceError
from ...redact import redact_uri
from ..location import Location, archive_kind

if TYPE_CHECKING:
    from .._common import Progress, TransferStats

__all__ = [
    "Scheme", "Remote", "OutputTarget", "FetchOptions", "FETCH", "DOWNLOAD", "PUSH", "SYNC", "OPERATIONS",
    "register", "unregister", "get", "names", "registered", "supporting", "listing",
]

FETCH = "fetch"
DOWNLOAD = "download"
PUSH = "push"
SYNC = "sync"
# Each operation and the methods a scheme that declares it implements (and one that does not, leaves alone).
OPERATIONS: dict[str, tuple[str, ...]] = {
    FETCH: ("fetch",),
    DOWNLOAD: ("probe", "download"),
    PUSH: ("push",),
    SYNC: ("output_target",),
}
_NAME_RE = re.compile(r"^[a-z][a-z0-9+.-]*$")


class Remote(Protocol):
    """What :meth:`Scheme.probe` learnt about a remote URI (a listing, HEAD answers, a manifest)."""

    @property
    def fingerprint(self) -> str | None:
        """A cache key that changes when the content does; None: never a cache hit (downloaded every time)."""


class OutputTarget(Protocol):
    """Where :class:`kubetune.storage.OutputSync` writes (layouts in :mod:`kubetune.storage.sync`).

    :class:`kubetune.storage.sync_targets.PrefixTarget` implements it over any store that can list, upload,
    download and delete under a prefix; a scheme can give that, or its own layout (``oci://``: tags).
    """

    def complete_checkpoints(self) -> list[str]:
        """Names (``checkpoint-N``) of the remote checkpoints that have their completion marker."""

    def upload_checkpoint(self, local: Path, name: str) -> None:
        """Upload a checkpoint folder as ``name``; its completion marker last."""

    def download_checkpoint(self, name: str, into: Path) -> None:
        """Download checkpoint ``name`` into the folder ``into``."""

    def delete_checkpoint(self, name: str) -> None:
        """Delete checkpoint ``name``; its completion marker first."""

    def publish(self, run_dir: Path) -> None:
        """Upload the run's final artifacts and record (the run is complete once this returns)."""


@dataclass(frozen=True)
class FetchOptions:
    """The arguments of :func:`kubetune.storage.fetch` a scheme's own :meth:`Scheme.fetch` may honour."""

    sha256: str | None = None
    use_cache: bool = True
    progress: bool = False
    allow_patterns: list[str] | None = None
    ignore_patterns: list[str] | None = None


class Scheme:
    """One URI scheme: how its URIs parse and which operations it offers.

    Subclasses set the class attributes and implement the methods of the operations they declare (and
    only those: :func:`register` checks). The optional hooks (:meth:`parse`, :meth:`expected_digest`,
    :meth:`names_single_archive`, :meth:`archive_name`) have defaults that suit most schemes.

    Attributes:
        names: the scheme names it answers to, lower case (``("http", "https")``).
        label: how messages list it (default ``NAME://``; ``http(s)://``).
        remote: fetched over the network: :func:`kubetune.storage.is_remote` is true for its URIs, and a URI
            whose credentials were masked (``***``) is refused instead of fetched.
        env_credentials: for schemes whose credentials come from the environment only: (what the URI's
            authority names, where the credentials come from). A URI with user-info is then refused.
        content_addressed: a given sha256 names the content: it becomes the cache key, and
            :meth:`download` checks it itself while the bytes arrive (fetch does not check again).
        operations: the operations it supports (``FETCH``, ``DOWNLOAD``, ``PUSH``, ``SYNC``).
    """

    names: tuple[str, ...] = ()
    label: str = ""
    remote: bool = False
    env_credentials: tuple[str, str] | None = None
    content_addressed: bool = False
    operations: frozenset[str] = frozenset()

    @property
    def display(self) -> str:
        """The label messages use (``s3://``)."""
        return self.label or f"{self.names[0]}://"

    def supports(self, operation: str) -> bool:
        """Whether the scheme declares ``operation``."""
        return operation in self.operations

    # --- parsing -----------------------------------------------------------------------------
    def parse(self, uri: str, scheme: str, rest: str, revision: str | None) -> Location:
        """Split ``uri`` (``rest``: what follows ``scheme://``) into a :class:`Location`.

        The default reads ``SCHEME://HOST/PATH``. ``revision`` is the caller's revision (hf); it wins over
        one in the URI.

        Raises:
            SourceError: the URI lacks a part the scheme needs (named, with the form to write).
        """
        host, _, path = rest.partition("/")
        return Location(uri=uri, scheme=scheme, host=host, path=path)

    # --- FETCH: materialise by itself ----------------------------------------------------------
    def fetch(self, loc: Location, dest: Path | None, stats: "TransferStats", options: FetchOptions) -> Path:
        """Materialise ``loc`` and return the local file or folder.

        Args:
            dest: the folder to put it in, or None (use it in place, or the scheme's own cache).
            stats: count the bytes and files moved (``stats.add``), skipped (``skip``), ``cached``.
        """
        raise NotImplementedError

    # --- DOWNLOAD: through the cache -----------------------------------------------------------
    def probe(self, loc: Location) -> Remote:
        """Look at what ``loc`` names without downloading it; the result's ``fingerprint`` keys the cache.

        Raises:
            SourceError: not found, access denied, unreachable (named, with what to set).
        """
        raise NotImplementedError

    def download(self, loc: Location, remote: Any, into: Path, stats: "TransferStats", progress: "Progress",
                 sha256: str | None) -> Path:
        """Download what :meth:`probe` found (``remote``) into the folder ``into`` and return the file or folder.

        ``into`` may hold an interrupted earlier attempt: skip what is there and verified. ``sha256`` is the
        expected digest; only a ``content_addressed`` scheme checks it here.
        """
        raise NotImplementedError

    def names_single_archive(self, loc: Location, remote: Any) -> bool:
        """True when ``loc`` names one archive, known before the download (it is then downloaded aside and
        unpacked into the destination). Default: False (an archive found afterwards is unpacked too)."""
        return False

    def expected_digest(self, loc: Location, sha256: str | None) -> str | None:
        """The sha256 the fetched file must have: the caller's, or one the URI carries (http's ``#sha256=``).

        Raises:
            SourceError: the URI's digest is malformed or disagrees with ``sha256``.
        """
        return sha256

    # --- PUSH ------------------------------------------------------------------------------------
    def push(self, source: Path, loc: Location, stats: "TransferStats", progress: "Progress",
             annotations: dict | None) -> dict:
        """Upload the file or folder ``source`` to ``loc``; returns extra summary fields (oci: ``digest``).

        Raises:
            SourceError: the destination cannot be written, or ``source`` is an empty folder.
        """
        raise NotImplementedError

    def archive_name(self, loc: Location) -> str | None:
        """The name ``push --tar`` gives the archive when the URI names one (``s3://b/m.tar.gz``), else None
        (``NAME.tar.gz`` after the source)."""
        return loc.basename if archive_kind(loc.basename) else None

    # --- SYNC ------------------------------------------------------------------------------------
    def output_target(self, loc: Location) -> OutputTarget:
        """Where OutputSync writes for ``output.uri`` = ``loc``.

        Raises:
            SourceError: ``loc`` cannot hold a run's outputs (e.g. an OCI digest instead of a tag).
        """
        raise NotImplementedError


# --- the registry ----------------------------------------------------------------------------
_BY_NAME: dict[str, Scheme] = {}
_ORDER: list[Scheme] = []


def _implements(scheme: Scheme, method: str) -> bool:
    return getattr(type(scheme), method) is not getattr(Scheme, method)


def register(scheme: Scheme) -> Scheme:
    """Add ``scheme`` under each of its names and return it.

    Raises:
        TypeError: it declares an operation whose methods it lacks, implements one it does not declare,
            declares none, or both FETCH and DOWNLOAD.
        ValueError: a name is malformed or already registered.
    """
    kind = type(scheme).__name__
    if not scheme.names:
        raise TypeError(f"{kind}: a scheme needs at least one name")
    unknown = set(scheme.operations) - set(OPERATIONS)
    if unknown or not scheme.operations:
        raise TypeError(f"{kind}: operations must be some of {sorted(OPERATIONS)}, got {sorted(scheme.operations)}")
    if {FETCH, DOWNLOAD} <= set(scheme.operations):
        raise TypeError(f"{kind}: declare FETCH or DOWNLOAD, not both")
    for op, methods in OPERATIONS.items():
        done = [m for m in methods if _implements(scheme, m)]
        if op in scheme.operations and len(done) != len(methods):
            raise TypeError(f"{kind}: declares {op!r} but does not implement {[m for m in methods if m not in done]}")
        if op not in scheme.operations and done:
            raise TypeError(f"{kind}: implements {done} but does not declare {op!r}")
    for name in scheme.names:
        if not _NAME_RE.match(name):
            raise ValueError(f"{kind}: '{name}' is not a lower-case URI scheme name")
        if name in _BY_NAME:
            raise ValueError(f"{kind}: the scheme '{name}://' is registered already ({type(_BY_NAME[name]).__name__})")
    for name in scheme.names:
        _BY_NAME[name] = scheme
    _ORDER.append(scheme)
    return scheme


def unregister(name: str) -> None:
    """Remove the scheme registered under ``name`` (all its names); nothing when there is none."""
    scheme = _BY_NAME.get(name)
    if scheme is None:
        return
    for n in scheme.names:
        _BY_NAME.pop(n, None)
    _ORDER.remove(scheme)


def get(name: str, uri: str | None = None) -> Scheme:
    """The scheme registered under ``name`` (lower case).

    Raises:
        SourceError: no such scheme; the message names ``uri`` (redacted) and the hint lists the supported ones.
    """
    scheme = _BY_NAME.get(name)
    if scheme is None:
        where = f"{redact_uri(uri)}: " if uri is not None else ""
        raise SourceError(f"{where}unknown URI scheme '{name}://'", hint=f"use a local path, {listing(_ORDER)}")
    return scheme


def names(*, remote: bool | None = None) -> tuple[str, ...]:
    """Every registered scheme name in registration order; ``remote=True``/``False``: only those (not) remote."""
    return tuple(n for s in _ORDER if remote is None or s.remote == remote for n in s.names)


def registered() -> tuple[Scheme, ...]:
    """The registered schemes, in registration order."""
    return tuple(_ORDER)


def supporting(operation: str) -> list[Scheme]:
    """The schemes that declare ``operation``, remote stores first (the order messages list destinations in)."""
    return sorted((s for s in _ORDER if s.supports(operation)), key=lambda s: not s.remote)


def listing(items: Iterable[Scheme]) -> str:
    """``a://, b:// or c://``: the schemes' labels for a message."""
    labels = [s.display for s in items]
    if len(labels) < 2:
        return "".join(labels) or "nothing"
    return ", ".join(labels[:-1]) + " or " + labels[-1]
