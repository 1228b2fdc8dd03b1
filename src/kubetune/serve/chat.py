"""A small OpenAI API chat client for ``kubetune chat URL``: streams replies from any compatible server.

It speaks plain HTTP with httpx (a kubetune dependency) rather than the ``openai`` package, so the CLI
needs nothing extra; it works against ``kubetune serve``, vLLM, or any OpenAI-compatible endpoint.
"""

from __future__ import annotations

import json
from typing import Iterator

from ..errors import BackendError

__all__ = ["RemoteChat", "is_url"]


def is_url(source: str) -> bool:
    """``source`` names a server (http:// or https://) rather than a run or model."""
    return source.startswith(("http://", "https://"))


class RemoteChat:
    """Chat with a model behind an OpenAI-compatible server.

    Args:
        url: the server, with or without the ``/v1`` suffix.
        model: the model id (default: the first one the server lists).
        api_key: sent as ``Authorization: Bearer KEY``.
        timeout: seconds to wait for the server.

    Raises:
        BackendError: the server is unreachable, refuses the key, or lists no model.
    """

    def __init__(self, url: str, *, model: str | None = None, api_key: str | None = None, timeout: float = 600.0) -> None:
        import httpx

        base = url.rstrip("/")
        self.base = base if base.endswith("/v1") else base + "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self.model = model or self._first_model()
        from ..redact import redact_uri

        self.source = f"{self.model} at {redact_uri(self.base)}"  # printed: "Chatting with ..."

    def models(self) -> list[str]:
        """The model ids the server lists."""
        data = self._json("GET", "/models")
        return [m["id"] for m in data.get("data", [])]

    def stream(self, messages: list[dict], *, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None) -> Iterator[str]:
        """Yield the assistant's reply piece by piece (the same call shape as :class:`~kubetune.serve.loading.ChatModel`)."""
        import httpx

        body: dict = {"model": self.model, "messages": messages, "max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "stream": True}
        if seed is not None:
            body["seed"] = seed
        try:
            with self._http.stream("POST", "/chat/completions", json=body) as r:
                if r.status_code >= 400:
                    r.read()
                    raise self._error(r)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:
                        raise BackendError(f"{self.base}: {event['error'].get('message')}")
                    for choice in event.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            yield piece
        except httpx.HTTPError as e:
            raise BackendError(f"{self.base}: {type(e).__name__}: {e}", hint="is the server still running?") from None

    def reply(self, messages: list[dict], **kw) -> str:
        """The whole reply as one string."""
        return "".join(self.stream(messages, **kw))

    def _first_model(self) -> str:
        ids = self.models()
        if not ids:
            raise BackendError(f"{self.base}: the server lists no models")
        return ids[0]

    def _json(self, method: str, path: str) -> dict:
        import httpx

        try:
            r = self._http.request(method, path)
        except httpx.HTTPError as e:
            raise BackendError(
                f"cannot reach {self.base}: {e}",
                hint="start a server with `kubetune serve RUN_DIR` (default http://127.0.0.1:8000), or pass its URL",
            ) from None
        if r.status_code >= 400:
            raise self._error(r)
        return r.json()

    def _error(self, r) -> BackendError:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:500] or r.reason_phrase
        hint = "pass --api-key KEY or set KUBETUNE_API_KEY" if r.status_code == 401 else None
        if r.status_code == 404 and "model" in message.lower():
            hint = "pick one with --model; GET /v1/models lists them"
        return BackendError(f"{self.base}: HTTP {r.status_code}: {message}", hint=hint)
