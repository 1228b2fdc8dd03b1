"""Who is asking: the API key in ``Authorization: Bearer KEY`` names a project (401 in OpenAI's shape
otherwise), and each key's requests per minute are limited (429). A server without any key is open, as the
one ``default`` project: :func:`kubetune.server.cli` refuses to bind anything but loopback then."""

from __future__ import annotations

import threading
import time

from fastapi import Request

from ..serve.protocol import APIError
from .config import ServerConfig
from .store import DEFAULT_PROJECT, Store

__all__ = ["Auth"]

_KEYS_CACHE_S = 2.0


class Auth:
    """The FastAPI dependency of every /v1 route: the caller's project (a dict), or 401 / 429."""

    def __init__(self, store: Store, config: ServerConfig) -> None:
        self.store = store
        self.config = config
        self._has_keys: tuple[float, bool] = (0.0, False)
        self._projects: dict[str, tuple[float, dict]] = {}  # key -> (checked at, project), a few seconds
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill)
        self._lock = threading.Lock()
        self._default: dict | None = None

    def __call__(self, request: Request) -> dict:
        """The project of the request's key (or the default project when the server has no keys)."""
        header = request.headers.get("authorization")
        if not self._keys_exist():
            if self._default is None:
                self._default = self.store.project(DEFAULT_PROJECT)
            return self._default
        if not header:
            raise _unauthorized("Missing API key: send the header 'Authorization: Bearer YOUR_KEY'")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise _unauthorized("Incorrect API key provided")
        project = self._project(key)
        if project is None:
            raise _unauthorized("Incorrect API key provided")
        self._rate(key)
        return project

    def _keys_exist(self) -> bool:
        at, value = self._has_keys
        now = time.monotonic()
        if now - at > _KEYS_CACHE_S:
            value = self.store.has_keys()
            self._has_keys = (now, value)
        return value

    def _project(self, key: str) -> dict | None:
        now = time.monotonic()
        hit = self._projects.get(key)
        if hit and now - hit[0] < _KEYS_CACHE_S:
            return hit[1]
        project = self.store.authenticate(key)
        if project is not None:
            self._projects[key] = (now, project)
        else:
            self._projects.pop(key, None)
        return project

    def _rate(self, key: str) -> None:
        limit = self.config.rate_limit_per_minute
        if not limit:
            return
        with self._lock:
            now = time.monotonic()
            tokens, last = self._buckets.get(key, (float(limit), now))
            tokens = min(float(limit), tokens + (now - last) * limit / 60.0)
            if tokens < 1.0:
                wait = max(1, int((1.0 - tokens) * 60.0 / limit + 0.999))
                self._buckets[key] = (tokens, now)
                raise APIError(429, f"Rate limit reached: {limit} requests per minute for this key; retry in {wait} s",
                               type="requests", code="rate_limit_exceeded", headers={"Retry-After": str(wait)})
            self._buckets[key] = (tokens - 1.0, now)


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
