"""The OCI registry client: authenticated (Basic and Bearer-token challenges), retried requests.

Credentials come from KUBETUNE_REGISTRY_USERNAME/PASSWORD, else the docker configuration
(``$DOCKER_CONFIG/config.json``: auths, credHelpers, credsStore), read with oras-py's helpers; they are
never logged. Loopback registries and the hosts in KUBETUNE_REGISTRY_PLAIN_HTTP are spoken to over http.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable

from .. import constants as C
from ..errors import SourceError
from . import web
from ._common import Transient, log, with_retries
from .uri import scrub

__all__ = ["Registry", "plain_http"]

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


def plain_http(host: str) -> bool:
    """True for loopback registries and the hosts named in KUBETUNE_REGISTRY_PLAIN_HTTP ("1": all)."""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    if name in ("localhost", "[::1]") or name.startswith("127."):
        return True
    setting = os.environ.get(C.ENV_REGISTRY_PLAIN_HTTP, "").strip()
    if setting.lower() in ("1", "true", "yes", "all"):
        return True
    return host in {h.strip() for h in setting.split(",") if h.strip()}


def _docker_config_path() -> str:
    return os.path.join(os.environ.get(C.ENV_DOCKER_CONFIG) or os.path.expanduser("~/.docker"), "config.json")


def _credentials(host: str) -> tuple[str | None, str]:
    """(base64 user:password or None, where it came from); values are never logged."""
    user, password = os.environ.get(C.ENV_REGISTRY_USERNAME), os.environ.get(C.ENV_REGISTRY_PASSWORD)
    if user and password:
        import oras.auth.utils

        return oras.auth.utils.get_basic_auth(user, password), f"{C.ENV_REGISTRY_USERNAME}/{C.ENV_REGISTRY_PASSWORD}"
    path = _docker_config_path()
    if not os.path.isfile(path):
        return None, "none"
    import oras.auth.utils
    import oras.utils

    cfg = oras.auth.utils.load_configs([path])
    for name in oras.utils.iter_localhosts(host):
        for key in (name, f"https://{name}", f"http://{name}", f"https://{name}/v1/"):
            entry = cfg["auths"].get(key)
            if entry and entry.get("auth"):
                return entry["auth"], f"auths in {path}"
            if entry and entry.get("username") and entry.get("password"):
                return oras.auth.utils.get_basic_auth(entry["username"], entry["password"]), f"auths in {path}"
        helper = cfg["credHelpers"].get(name) or cfg.get("credsStore")
        if helper:
            try:
                out = subprocess.run([f"docker-credential-{helper}", "get"], input=name.encode(), capture_output=True, check=True, timeout=30)
                data = json.loads(out.stdout)
                return oras.auth.utils.get_basic_auth(data["Username"], data["Secret"]), f"docker-credential-{helper}"
            except (OSError, subprocess.SubprocessError, ValueError, KeyError):
                log.warning("registry %s: credential helper docker-credential-%s gave nothing", host, helper)
    return None, "none"


class Registry:
    """A registry host: authenticated, retried requests (Basic and Bearer-token challenges)."""

    def __init__(self, host: str, label: str) -> None:
        self.host = host
        self.label = label
        self.base = f"{'http' if plain_http(host) else 'https'}://{host}"
        self.http = web.client()
        self._basic, self._cred_source = _credentials(host)
        self._auth: dict[str, str] = {}
        self.probed: set[str] = set()

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.http.close()

    def url(self, repo: str, tail: str) -> str:
        """The registry API URL ``/v2/<repo>/<tail>`` (plain http where configured)."""
        return f"{self.base}/v2/{repo}/{tail}"

    def auth_headers(self) -> dict:
        """Headers carrying the credentials for this registry, if any."""
        return dict(self._auth)

    def denied(self, status: int, what: str = "") -> SourceError:
        """The SourceError for a refused request (names the credentials to set)."""
        return SourceError(
            f"{self.label}: access denied by registry {self.host} (HTTP {status}){what}",
            hint=f"credentials looked for: {C.ENV_REGISTRY_USERNAME} + {C.ENV_REGISTRY_PASSWORD}, then auths/credHelpers/credsStore "
            f"in {_docker_config_path()} ({C.ENV_DOCKER_CONFIG}); found: {self._cred_source}",
        )

    def unreachable(self, e: Exception) -> SourceError:
        """The SourceError for a registry that cannot be reached."""
        return SourceError(
            f"{self.label}: cannot reach registry {self.host} over {self.base.split(':')[0]} ({scrub(e) or type(e).__name__})",
            hint=f"check the address; a registry without TLS needs {C.ENV_REGISTRY_PLAIN_HTTP}={self.host}",
        )

    def request(self, method: str, url: str, *, scope: str, headers: dict | None = None,
                body: Callable[[], Any] | None = None, ok: tuple[int, ...] = (200,), stream: bool = False):
        """One request with retries and auth; ``body`` makes the request content anew for each attempt."""
        import httpx

        def attempt(i: int):
            for authed in (False, True):
                req = self.http.build_request(method, url, headers={**self._auth, **(headers or {})}, content=body() if body else None)
                try:
                    r = self.http.send(req, stream=stream)
                except httpx.ConnectError as e:
                    if i >= 2:
                        raise self.unreachable(e) from None
                    raise Transient(f"cannot connect ({scrub(e)})") from None
                except httpx.TransportError as e:
                    raise Transient(f"{type(e).__name__} ({scrub(e)})") from None
                if r.status_code == 401 and not authed:
                    r.read()
                    r.close()
                    self._authenticate(r, scope)
                    continue
                if r.status_code in _RETRY_STATUS:
                    r.close()
                    raise Transient(f"HTTP {r.status_code}", web._retry_after(r))
                if r.status_code in (401, 403):
                    r.close()
                    raise self.denied(r.status_code)
                if r.status_code not in ok:
                    if stream:
                        r.read()
                    return r  # callers turn the other statuses into their own messages
                return r
            raise self.denied(401)

        try:
            return with_retries(attempt, what=f"{method} {self.label}")
        except Transient as e:
            raise SourceError(f"{self.label}: registry {self.host} keeps failing ({e})", hint="try again later") from None

    def _authenticate(self, r, scope: str) -> None:
        import oras.auth.utils

        challenge = r.headers.get("www-authenticate", "")
        kind = challenge.split(" ", 1)[0].lower()
        if kind == "basic":
            if not self._basic:
                raise self.denied(401, ": the registry wants a user name and password")
            self._auth = {"Authorization": f"Basic {self._basic}"}
            return
        if kind != "bearer":
            raise self.denied(401, f": unsupported challenge '{kind}'")
        h = oras.auth.utils.parse_auth_header(challenge)
        params = {k: v for k, v in (("service", h.service), ("scope", h.scope or scope)) if v}
        headers = {"Authorization": f"Basic {self._basic}"} if self._basic else {}
        try:
            t = self.http.get(h.realm or "", params=params, headers=headers)
        except Exception as e:  # noqa: BLE001 - any failure to get a token is reported the same way
            raise self.unreachable(e) from None
        if t.status_code != 200:
            raise self.denied(t.status_code, " (token request refused)")
        data = t.json()
        token = data.get("token") or data.get("access_token")
        if not token:
            raise self.denied(401, " (no token in the token response)")
        self._auth = {"Authorization": f"Bearer {token}"}
