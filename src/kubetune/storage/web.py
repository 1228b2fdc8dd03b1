"""http(s):// sources: streamed downloads that resume with Range, retry transient failures and verify.

A download is written to ``NAME.kubetune-part`` and renamed only after its size (and sha256, when
given) check out. When the connection drops, the next attempt asks for the rest with ``Range`` and
``If-Range`` (the ETag or Last-Modified seen first), so a changed file restarts instead of mixing
two versions. A sidecar ``NAME.kubetune-part.json`` remembers that validator, so a killed process
resumes too. The OCI transport uses :func:`stream_to_file` for registry blobs.
"""

from __future__ import annotations

import base64
import email.utils
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import SourceError
from ._common import RETRY, Progress, RetryPolicy, Transient, TransferStats, file_digest, log, part_path, with_retries
from .uri import Location, scrub

__all__ = ["Remote", "probe", "download", "stream_to_file", "client"]

_CONNECT_ATTEMPTS = 3  # a refused connection is rarely transient: fail fast with a clear message
_RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}


@dataclass
class Remote:
    """What a HEAD request told us about a URL."""

    url: str
    size: int | None
    etag: str | None
    last_modified: str | None

    @property
    def fingerprint(self) -> str | None:
        """A cache key that changes when the file does: the strong ETag, else Last-Modified, with the size; None
        when the server gives neither (never a cache hit: downloaded every time)."""
        if self.etag and not self.etag.startswith("W/"):
            return f"etag:{self.etag}:{self.size}"
        if self.last_modified:
            return f"lm:{self.last_modified}:{self.size}"
        return None


def netrc_login(host: str | None, path: str | None = None) -> tuple[str, str] | None:
    """(login, password) for ``host`` from the netrc file (``$NETRC``, else ``~/.netrc``), as curl and pip read
    it; None when there is no file, no entry for the host (nor a ``default`` entry) or the file cannot be parsed."""
    import netrc

    if not host:
        return None
    path = path or os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not os.path.isfile(path):
        return None
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError) as e:
        log.warning("%s: cannot be read, so it gives no credentials (%s)", path, e)
        return None
    if not entry:
        return None
    login, _account, password = entry
    return login or "", password or ""


def _auth():
    """Basic auth from the URL's ``user:password@``, else from the netrc file for the URL's host. httpx 0.28
    no longer reads netrc itself, and a client-level auth would make it ignore the URL's credentials."""
    import httpx

    class _UrlOrNetrcAuth(httpx.Auth):
        def auth_flow(self, request):
            if "authorization" not in request.headers:
                url = request.url
                creds = (url.username, url.password) if (url.username or url.password) else netrc_login(url.host)
                if creds:
                    token = base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
                    request.headers["Authorization"] = f"Basic {token}"
            yield request

    return _UrlOrNetrcAuth()


def client(**kw: Any):
    """An httpx client with kubetune's timeouts (credentials in the URL become Basic auth, else ~/.netrc's
    entry for the host is used, as curl does with --netrc)."""
    import httpx

    kw.setdefault("auth", _auth())
    return httpx.Client(
        timeout=httpx.Timeout(60.0, connect=10.0),
        follow_redirects=True,
        trust_env=True,
        headers={"User-Agent": "kubetune"},
        **kw,
    )


def probe(loc: Location, *, http=None) -> Remote:
    """HEAD the URL: size and validators for the cache. Servers that refuse HEAD give an empty Remote."""
    import httpx

    own = http is None
    http = http or client()
    try:
        def attempt(i: int) -> httpx.Response:
            try:
                r = http.head(loc.uri)
            except httpx.ConnectError as e:
                if i + 1 >= _CONNECT_ATTEMPTS:
                    raise _unreachable(loc, e) from None
                raise Transient(f"cannot connect ({scrub(e)})") from None
            except httpx.TransportError as e:
                raise Transient(scrub(e) or type(e).__name__) from None
            if r.status_code in _RETRY_STATUS:
                raise Transient(f"HTTP {r.status_code}", _retry_after(r))
            return r

        try:
            r = with_retries(attempt, what=f"HEAD {loc.safe}")
        except Transient as e:
            raise SourceError(f"{loc.safe}: the server keeps failing ({e})", hint="try again later") from None
        if r.status_code in (404, 410):
            raise _http_error(loc, r.status_code)
        if r.status_code >= 400:  # HEAD not allowed (presigned GET URLs, some CDNs): GET tells the truth
            return Remote(loc.uri, None, None, None)
        size = r.headers.get("content-length")
        return Remote(
            url=str(r.url),
            size=int(size) if size and size.isdigit() and "content-encoding" not in r.headers else None,
            etag=r.headers.get("etag"),
            last_modified=r.headers.get("last-modified"),
        )
    finally:
        if own:
            http.close()


def download(
    loc: Location,
    target_dir: Path,
    stats: TransferStats,
    progress: Progress,
    *,
    remote: Remote | None = None,
    sha256: str | None = None,
) -> Path:
    """Download ``loc`` into ``target_dir/<basename>`` and return that path."""
    target = target_dir / loc.basename
    with client() as http:
        remote = remote or probe(loc, http=http)
        stamp = _http_time(remote.last_modified)
        if (target.is_file() and remote.size is not None and stamp is not None and not sha256
                and target.stat().st_size == remote.size and abs(target.stat().st_mtime - stamp) < 1):
            stats.skip(remote.size)  # downloaded before, same size and same Last-Modified
            return target
        stream_to_file(
            http, loc.uri, target, label=loc.safe, expected_size=remote.size, sha256=sha256,
            validator=remote.etag if remote.etag and not remote.etag.startswith("W/") else remote.last_modified,
            stats=stats, progress=progress,
        )
        if stamp is not None:
            os.utime(target, (stamp, stamp))
    return target


def stream_to_file(
    http,
    url: str,
    target: Path,
    *,
    label: str,
    expected_size: int | None = None,
    sha256: str | None = None,
    validator: str | None = None,
    headers: Callable[[], dict] | None = None,
    stats: TransferStats | None = None,
    progress: Progress | None = None,
    policy: RetryPolicy | None = None,
    on_status: Callable[[int], SourceError | None] | None = None,
) -> Path:
    """GET ``url`` into ``target`` through ``target.kubetune-part``, resuming with Range after failures.

    Args:
        http: an httpx.Client.
        label: the redacted URI for messages.
        expected_size: bytes the file must have (None: trust the server's length).
        sha256: hex digest the file must have.
        validator: ETag or Last-Modified, sent as If-Range when resuming.
        headers: extra request headers (auth), asked for on each attempt.
        on_status: maps an error status to the SourceError to raise (None: the default messages).

    Raises:
        SourceError: not found, access denied, unreachable, repeated failures, or an integrity mismatch.
    """
    import httpx

    sha256 = sha256.lower().removeprefix("sha256:") if sha256 else None
    target.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(target)
    state_file = part.with_name(part.name + ".json")
    state = _read_state(state_file)
    if part.exists() and (state.get("url") != _url_key(url) or (validator and state.get("validator") not in (None, validator))):
        part.unlink()  # left by a download of something else, or of an older version
    _write_state(state_file, {"url": _url_key(url), "validator": validator})
    known = {"size": expected_size}

    def attempt(i: int) -> None:
        offset = part.stat().st_size if part.exists() else 0
        if known["size"] is not None and offset == known["size"] and offset > 0:
            return
        # identity: byte ranges must count the bytes we store, not a compressed stream's
        req_headers = {"Accept-Encoding": "identity", **(headers() if headers else {})}
        if offset:
            req_headers["Range"] = f"bytes={offset}-"
            if validator:
                req_headers["If-Range"] = validator
        try:
            with http.stream("GET", url, headers=req_headers) as r:
                if r.status_code == 416 and offset:
                    part.unlink()  # our partial file is longer than the remote one: start over
                    raise Transient("range not satisfiable; restarting")
                if r.status_code in _RETRY_STATUS:
                    raise Transient(f"HTTP {r.status_code}", _retry_after(r))
                if r.status_code >= 400:
                    err = on_status(r.status_code) if on_status else None
                    raise err or _http_error_label(label, r.status_code)
                mode = "ab"
                if offset and r.status_code == 206:
                    if _content_range_start(r.headers.get("content-range")) != offset:
                        part.unlink()
                        raise Transient(f"asked for bytes {offset}-, got {r.headers.get('content-range')}; restarting")
                else:
                    if offset:
                        log.info("%s: the server ignored Range (or the file changed); restarting from 0", label)
                    mode, offset = "wb", 0
                total = _total_size(r, offset)
                if total is not None and known["size"] is None:
                    known["size"] = total
                if progress and i == 0:
                    progress.expect(known["size"] or 0)
                with open(part, mode) as f:
                    for block in r.iter_bytes():  # as it arrives: a drop keeps every byte received
                        f.write(block)
                        if stats:
                            stats.add(len(block))
                        if progress:
                            progress.advance(len(block))
        except httpx.ConnectError as e:
            if i + 1 >= _CONNECT_ATTEMPTS and not part.exists():
                raise _unreachable_label(label, e) from None
            raise Transient(f"cannot connect ({scrub(e)})") from None
        except httpx.TransportError as e:  # reset, timeout, truncated body: resume from what we have
            have = part.stat().st_size if part.exists() else 0
            raise Transient(f"{type(e).__name__} after {have} bytes ({scrub(e)})") from None
        size = part.stat().st_size
        if known["size"] is not None and size != known["size"]:
            raise Transient(f"got {size} of {known['size']} bytes")

    try:
        with_retries(attempt, what=f"GET {label}", policy=policy)
    except Transient as e:
        raise SourceError(
            f"{label}: download failed after {(policy or RETRY).attempts} attempts ({e})",
            hint="the partial file is kept; run the same command again to resume",
        ) from None
    if sha256:
        got = file_digest(part)
        if got != sha256:
            part.unlink()
            state_file.unlink(missing_ok=True)
            raise SourceError(
                f"{label}: sha256 mismatch: expected {sha256}, got {got}",
                hint="the file changed or was corrupted; check the URL and the expected digest",
            )
    os.replace(part, target)
    state_file.unlink(missing_ok=True)
    if stats:
        stats.add(0, 1)
    return target


# --- helpers ---------------------------------------------------------------------------------
def _url_key(url: str) -> str:
    import hashlib

    return hashlib.sha256(url.split("?", 1)[0].encode()).hexdigest()[:16]  # never store the query (tokens)


def _read_state(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_state(path: Path, state: dict) -> None:
    path.write_text(json.dumps(state), encoding="utf-8")


def _content_range_start(value: str | None) -> int | None:
    # "bytes 100-199/200"
    try:
        return int(value.split()[1].split("-")[0]) if value else None
    except (IndexError, ValueError):
        return None


def _total_size(r, offset: int) -> int | None:
    cr = r.headers.get("content-range")
    if r.status_code == 206 and cr and "/" in cr:
        total = cr.rsplit("/", 1)[1]
        return int(total) if total.isdigit() else None
    length = r.headers.get("content-length")
    if length and length.isdigit() and "content-encoding" not in r.headers:
        return int(length) + (offset if r.status_code == 206 else 0)
    return None


def _http_time(value: str | None) -> float | None:
    try:
        return email.utils.parsedate_to_datetime(value).timestamp() if value else None
    except (TypeError, ValueError):
        return None


def _retry_after(r) -> float | None:
    value = r.headers.get("retry-after")
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _http_error(loc: Location, status: int) -> SourceError:
    return _http_error_label(loc.safe, status)


def _http_error_label(label: str, status: int) -> SourceError:
    if status in (404, 410):
        return SourceError(f"{label}: not found (HTTP {status})", hint="check the URL")
    if status in (401, 403):
        return SourceError(
            f"{label}: access denied (HTTP {status})",
            hint="credentials looked for: user:password in the URL and ~/.netrc for this host; "
            "a presigned URL may have expired: create a new one",
        )
    return SourceError(f"{label}: the server answered HTTP {status}")


def _unreachable(loc: Location, e: Exception) -> SourceError:
    return _unreachable_label(loc.safe, e)


def _unreachable_label(label: str, e: Exception) -> SourceError:
    return SourceError(
        f"{label}: cannot reach the server ({scrub(e) or type(e).__name__})",
        hint="check the host and port, your network, and HTTPS_PROXY/HTTP_PROXY if you use a proxy",
    )
