"""Credentials out of everything kubetune shows, logs or saves: one definition, used by every sink.

A credential in a URI is the *user-info* of its authority and the *value* of a parameter whose name looks
like a credential. :func:`redact_uri` masks them in one URI, :func:`redact_text` in free text (error
messages, exception text, log lines of httpx/urllib3/botocore, which also print bare paths such as
``GET /x?token=...``), :func:`redact_data` in every string of a JSON-like structure (events, status,
results, the saved spec). Each masked part becomes ``***``; the rest stays exactly as written, so the user
still sees which URI it was::

    https://user:pass@host/x?token=abc&v=1        -> https://***@host/x?token=***&v=1
    https://ghp_TOKEN@github.com/org/repo          -> https://***@github.com/org/repo
    GET /d.jsonl?X-Amz-Signature=abc HTTP/1.1      -> GET /d.jsonl?X-Amz-Signature=*** HTTP/1.1

Where it is applied (so that no path has to remember it): :class:`~kubetune.errors.KubetuneError`
messages and hints; :class:`~kubetune.events.RunDir` (events.jsonl, status.json, result.json, stdout event
lines); ``spec.yaml`` and ``kubetune validate`` (:func:`kubetune.spec.dump_spec`); log records of every
logger and the worker's stdout/stderr, hence ``logs/worker.log`` (:func:`install`); ``kubetune serve``'s
model ids, model cards and metrics. Clusters get no credential at all: rendering refuses them
(:func:`find_credentials`).

This module imports only the standard library and :mod:`kubetune.constants`, so that every layer may use it.
"""

from __future__ import annotations

import io
import logging
import re
import sys
import threading
from typing import Any, Iterable
from urllib.parse import unquote_plus

from . import constants as C

__all__ = [
    "MASK",
    "redact_uri",
    "redact_text",
    "redact_data",
    "is_secret_name",
    "has_credentials",
    "find_credentials",
    "is_redacted",
    "RedactingStream",
    "install",
]

MASK = C.REDACTED

# Query/fragment/matrix parameter names that carry credentials, compared lower-cased after percent-decoding:
# the names of presigned URLs (S3, GCS), Azure SAS tokens (every SAS field: the signature alone is useless to
# hide when the rest tells how to rebuild the request) and common API conventions...
_SECRET_PARAM_NAMES = frozenset(
    {
        "access", "access_token", "auth", "code", "key", "password", "pass", "passwd", "pwd", "pw", "secret",
        "sig", "signature", "token", "apikey", "api_key", "ticket",
        "x-amz-signature", "x-amz-credential", "x-amz-security-token",
        "x-goog-signature", "x-goog-credential",
        "sv", "ss", "srt", "sp", "se", "st", "spr", "sr", "si", "sip", "sdd",  # Azure SAS
        "skoid", "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid",
    }
)
# ...and any name containing one of these (api-key, X-Api-Key, client_secret, refresh_token, db_password,
# oauth_signature, session_id, private_key, jwt, ...). Over-masking a harmless parameter costs readability only.
_SECRET_PARAM_RE = re.compile(r"token|secret|pass|pwd|sig|key|cred|auth|session|jwt|bearer|private|otp|cookie|sas", re.I)

# Characters that end a URI (or a parameter value) inside free text; quotes and backslashes too, so that a
# URI inside JSON, a repr or an escaped string keeps its closing quote.
_TEXT_STOP = " \t\r\n\f\v\"'`<>\\"
# Text looks like it might hold a credential only if it holds one of these, lower-cased (a fast path for logs).
_CHEAP_HINTS = ("//", "\\/\\/", "=", "%3d", "authorization", "bearer", "basic", "token", "key", "cookie")
# Punctuation that ends a sentence rather than a value: "<uri>?token=abc: not found" keeps its colon.
_TRAILING_PUNCT = ":,.;)]}"

# `//` that opens an authority: after a scheme's colon, or at the start of a token (scheme-relative).
_AUTHORITY_START_RE = re.compile(r"(?:(?<=:)|(?<![^\s\"'`(<\[=,]))(?://|\\/\\/)")  # also JSON's escaped :\/\/
# A parameter name after ?, &, ; or # (the value follows the `=`). Names stop at delimiters and text stops.
_PARAM_RE = re.compile(r"[?&;#]([^=&;#?/\s\"'`<>\\]+)=")
# A parameter without `=` whose percent-decoded form has one: ?token%3Dabc
_ENCODED_PARAM_RE = re.compile(r"[?&;#]([^=&;#?/\s\"'`<>\\]*%3[dD][^&;#?\s\"'`<>\\]*)")
# Credentials in HTTP header dumps (botocore/urllib3 debug logs, exception reprs).
_HEADER_RE = re.compile(
    r"(?i)((?:proxy-)?authorization|x-amz-security-token|x-api-key|api-key|cookie|set-cookie|x-goog-api-key)"
    r"(['\"]?\s*:\s*(?:b(?=['\"]))?['\"]?)([^'\"\r\n]+)"
)
# `Bearer X` / `Basic X` as HTTP writes them; X must look like a token (_looks_like_token), so prose stays.
_SCHEME_TOKEN_RE = re.compile(r"\b(Bearer|Basic|BEARER|BASIC|bearer)(\s+)([A-Za-z0-9._~+/=:-]{8,})")
_SIGV4_RE = re.compile(r"(?<![\w-])(Credential|Signature)=([^,\s\"'&]+)")


def is_secret_name(name: str) -> bool:
    """Whether a query/fragment parameter named ``name`` (percent-encoded or not) carries a credential."""
    n = unquote_plus(str(name)).strip().lower()
    return n in _SECRET_PARAM_NAMES or bool(_SECRET_PARAM_RE.search(n))


def redact_uri(uri: Any) -> str:
    """``uri`` with its user-info and credential parameter values replaced by ``***``.

    The whole value is taken as one URI (whitespace does not end it), so it suits spec fields and arguments.
    Anything else (a plain path, ``builtin://``, a URI without credentials) comes back unchanged.
    """
    text = "" if uri is None else str(uri)
    return _redact(text, stops="")


def redact_text(text: Any) -> str:
    """``text`` with the credentials of every URI in it masked, plus credential parameters of bare paths
    (``GET /x?token=...``) and credential headers (``Authorization: ...``, ``Bearer ...``)."""
    s = "" if text is None else str(text)
    low = s.lower()
    if not any(h in low for h in _CHEAP_HINTS):
        return s
    s = _redact(s, stops=_TEXT_STOP)
    s = _HEADER_RE.sub(lambda m: m.group(1) + m.group(2) + (MASK if m.group(3).strip() != MASK else m.group(3)), s)
    s = _SCHEME_TOKEN_RE.sub(lambda m: m.group(1) + m.group(2) + (MASK if _looks_like_token(m.group(3)) else m.group(3)), s)
    return _SIGV4_RE.sub(lambda m: f"{m.group(1)}={MASK}", s)


def _looks_like_token(word: str) -> bool:
    """A word after ``Bearer``/``Basic`` that is a credential, not prose ("Basic settings"): it holds a digit or
    a symbol, or capitals after its first letter (base64 such as ``dXNlcjpwYXNz``)."""
    return any(not c.isalpha() for c in word) or any(c.isupper() for c in word[1:])


def redact_data(value: Any) -> Any:
    """A copy of a JSON-like structure (dicts, lists, tuples, strings) with :func:`redact_text` applied to
    every string value. Keys are kept as they are; other values (numbers, None, ...) are returned unchanged."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_data(v) for v in value)
    if value is None or isinstance(value, (int, float, bool)):
        return value
    try:  # an object that prints as a URI (httpx.URL, an exception): its text, masked, when it holds credentials
        text = str(value)
    except Exception:
        return value
    masked = redact_text(text)
    return masked if masked != text else value


def has_credentials(value: Any) -> bool:
    """Whether ``value`` (a URI or text) holds anything :func:`redact_text` / :func:`redact_uri` would mask."""
    s = str(value)
    return redact_uri(s) != s or redact_text(s) != s


def find_credentials(data: Any, prefix: str = "") -> list[str]:
    """Dotted paths (``dataset.mix.0.source``) of the strings in ``data`` that hold credentials."""
    found: list[str] = []
    if isinstance(data, str):
        if has_credentials(data):
            found.append(prefix or "(value)")
    elif isinstance(data, dict):
        for k, v in data.items():
            found += find_credentials(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            found += find_credentials(v, f"{prefix}.{i}" if prefix else str(i))
    return found


def is_redacted(uri: Any) -> bool:
    """Whether ``uri`` had its credentials masked already (``***@`` or a ``=***`` credential value).

    Such a URI came from a saved spec or a log: the credentials are gone, so fetching it cannot work.
    """
    s = str(uri)
    if MASK not in s:
        return False
    probe = s.replace(MASK, "x")
    return redact_uri(probe) != probe


# --- the masking itself ------------------------------------------------------------------------
def _redact(s: str, *, stops: str) -> str:
    s = _redact_plain(s, stops)
    if "%" in s:  # a URI inside another one, percent-encoded: ?next=https%3A%2F%2Fuser%3Apass%40host
        s = _redact_encoded(s, stops)
    return s


def _redact_plain(s: str, stops: str) -> str:
    if "//" in s or "\\/\\/" in s:
        s = _mask_authorities(s, stops)
    if "=" in s or "%3d" in s.lower():
        s = _mask_params(s, stops)
    return s


_TOKEN_RE = re.compile(r"\S*%[0-9A-Fa-f]{2}\S*")


def _redact_encoded(s: str, stops: str) -> str:
    """Tokens (the whole value for a URI) whose percent-decoded form (once or twice) holds a credential are
    replaced by that decoded form, masked: readable, and nothing hides behind an encoding."""

    def fix(token: str) -> str:
        decoded = token
        for _ in range(2):
            decoded = unquote_plus(decoded)
            masked = _redact_plain(decoded, stops)
            if masked != decoded:
                return masked
        return token

    return fix(s) if not stops else _TOKEN_RE.sub(lambda m: fix(m.group(0)), s)


def _mask_authorities(s: str, stops: str) -> str:
    """Mask the user-info of every ``//authority`` in ``s``."""
    out: list[str] = []
    pos = 0
    for m in _AUTHORITY_START_RE.finditer(s):
        start = m.end()
        if start < pos:
            continue  # inside a part masked already
        end = start
        while end < len(s) and s[end] not in "/?#" and s[end] not in stops:
            end += 1
        authority = s[start:end]
        at = authority.rfind("@")
        if at >= 0:
            if authority[:at] == MASK:
                continue
            out.append(s[pos:start] + MASK)
            pos = start + at  # keep "@host..."
            continue
        cut = _bad_port(authority, stops)
        if cut is None:
            continue
        # A "port" that is no number: a password with an unescaped / ? or # (https://u:p/ss@host) cut the
        # authority short. Mask up to the next @ of this URI (in text: before the next blank, a quote may be
        # part of the password); with none, mask the pseudo-port.
        tail_end = start
        while tail_end < len(s) and not (stops and s[tail_end].isspace()):
            tail_end += 1
        nxt = s.find("@", end, tail_end)
        if nxt >= 0:
            out.append(s[pos:start] + MASK)
            pos = nxt
        else:
            out.append(s[pos : start + cut] + MASK)
            pos = end
    out.append(s[pos:])
    return "".join(out)


def _bad_port(authority: str, stops: str) -> int | None:
    """Offset of the "port" in ``authority`` when it is not a number (None: no port, or a real one)."""
    host_end = authority.rfind("]") + 1 if authority.startswith("[") else 0
    colon = authority.find(":", host_end)
    if colon < 0:
        return None
    port = authority[colon + 1 :].rstrip(".,;:)]}>\"'`") if stops else authority[colon + 1 :]
    if not port or port.isdigit() or port == MASK:
        return None
    return colon + 1


def _mask_params(s: str, stops: str) -> str:
    """Mask the values of credential parameters (``?``, ``&``, ``;`` or ``#`` then NAME=VALUE) in ``s``."""
    ends = "&#" + stops
    spans: list[tuple[int, int]] = []
    for m in _PARAM_RE.finditer(s):
        if not is_secret_name(m.group(1)):
            continue
        v0 = v1 = m.end()
        while v1 < len(s) and s[v1] not in ends:
            v1 += 1
        if stops:  # free text: a sentence's punctuation after the value is no part of it
            while v1 > v0 and s[v1 - 1] in _TRAILING_PUNCT:
                v1 -= 1
        if v1 > v0 and s[v0:v1] != MASK:
            spans.append((v0, v1))
    for m in _ENCODED_PARAM_RE.finditer(s):
        name = unquote_plus(m.group(1)).partition("=")[0]
        if is_secret_name(name):
            spans.append((m.start(1), m.end(1)))
    if not spans:
        return s
    out, pos = [], 0
    for a, b in sorted(spans):
        if a < pos:
            a = pos  # overlapping spans (a value holding ;token=...): mask their union
            if b <= a:
                continue
        out.append(s[pos:a] + MASK)
        pos = b
    out.append(s[pos:])
    return "".join(out)


# --- logs and streams ----------------------------------------------------------------------------
class RedactingStream(io.TextIOBase):
    """A text stream that masks credentials in what is written through it (whole lines at a time, so a
    URI printed in pieces is still seen whole), then writes to ``target``.

    Args:
        target: the real stream (``sys.stdout`` / ``sys.stderr``).
    """

    def __init__(self, target: Any) -> None:
        self._target = target
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        """Queue ``text``; every complete line (up to the last newline) goes to the target masked.

        Returns:
            ``len(text)``: all of it is accepted (a partial line waits for its end or :meth:`flush`).
        """
        with self._lock:
            self._pending += text
            cut = max(self._pending.rfind("\n"), self._pending.rfind("\r")) + 1
            if cut:
                done, self._pending = self._pending[:cut], self._pending[cut:]
                self._target.write(redact_text(done))
        return len(text)

    def flush(self) -> None:
        """Write the partial line held back (masked) and flush the target."""
        with self._lock:
            if self._pending:
                rest, self._pending = self._pending, ""
                self._target.write(redact_text(rest))
        self._target.flush()

    def writable(self) -> bool:
        """Always True: this stream is for writing."""
        return True

    def isatty(self) -> bool:
        """Whether the target is a terminal (so colour and progress bars behave as they would without masking)."""
        return bool(getattr(self._target, "isatty", lambda: False)())

    def fileno(self) -> int:
        """The target's file descriptor (writes through it bypass the masking)."""
        return self._target.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The target's encoding (utf-8 when it has none)."""
        return getattr(self._target, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


_installed = False
_install_lock = threading.Lock()


def install(*, stdout: bool = False, stderr: bool = False) -> None:
    """Mask credentials in every log record of this process (any logger, any handler: httpx's
    ``HTTP Request: GET https://user:pass@...``, urllib3's ``GET /x?token=...``, botocore's header dumps),
    and, when asked, in everything written to ``sys.stdout`` / ``sys.stderr`` (tracebacks, prints of
    libraries). Safe to call more than once.

    Args:
        stdout: wrap ``sys.stdout`` in a :class:`RedactingStream` (the worker: its output is logs/worker.log).
        stderr: wrap ``sys.stderr`` (the worker and the CLI, whose stderr carries errors and logs).
    """
    global _installed
    with _install_lock:
        if not _installed:
            logging.setLogRecordFactory(_redacting_factory(logging.getLogRecordFactory()))
            _installed = True
        for name, wanted in (("stdout", stdout), ("stderr", stderr)):
            if wanted:
                stream = getattr(sys, name)
                if stream is not None and not isinstance(stream, RedactingStream):
                    setattr(sys, name, RedactingStream(stream))


def _redacting_factory(make: Any) -> Any:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            _redact_record(record)
        except Exception:  # a record that cannot even be formatted is the logging module's to report
            pass
        return record

    factory._kubetune_redacting = True  # type: ignore[attr-defined]
    return factory


def _redact_record(record: logging.LogRecord) -> None:
    if record.args:
        # Mask the arguments one by one (handlers such as uvicorn's access log read record.args); the template
        # is left alone (masking "%s://%s:%s" would break it). A URI still whole only in the formatted message
        # (a template with a literal URI, a URI assembled from several arguments) collapses the record to it.
        record.args = _redact_args(record.args)
        message = record.getMessage()
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
    elif record.msg is not None:
        text = record.msg if isinstance(record.msg, str) else str(record.msg)
        masked = redact_text(text)
        if masked != text:
            record.msg = masked
    if record.exc_info and not record.exc_text:
        record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
    elif record.exc_text:
        record.exc_text = redact_text(record.exc_text)
    if record.stack_info:
        record.stack_info = redact_text(record.stack_info)


def _redact_args(args: Any) -> Any:
    if isinstance(args, dict):
        return {k: _redact_arg(v) for k, v in args.items()}
    if isinstance(args, tuple):
        return tuple(_redact_arg(a) for a in args)
    return _redact_arg(args)


def _redact_arg(value: Any) -> Any:
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    if isinstance(value, str):
        return redact_text(value)
    try:
        text = str(value)
    except Exception:
        return value
    red = redact_text(text)
    return red if red != text else value


def redacted_lines(lines: Iterable[str]) -> Iterable[str]:
    """Each line with :func:`redact_text` applied (for logs read back from a file or a pod)."""
    for line in lines:
        yield redact_text(line)
