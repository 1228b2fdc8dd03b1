"""An HTTP **test double** of the Hugging Face Hub paths huggingface_hub calls to create a repository and a branch,
commit files, list a tree, read a revision and download a file (no Hub is reachable here). It checks the bearer
token, answers every pre-upload with ``regular`` (files inline in the commit, no LFS/Xet storage), applies commits
atomically (a commit's files all appear at once) and records them for the tests. Start it on 127.0.0.1 and point
``HF_ENDPOINT`` at ``url``."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["HubDouble"]


def _blob_id(data: bytes) -> str:
    """git's blob id, which the Hub gives as a regular file's ``oid``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubDouble:
    """Repositories in memory: ``repos[repo_id][branch] = {path: bytes}``; ``commits``: (repo_id, branch, summary, paths)."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}
        self.private: dict[str, bool] = {}
        self.commits: list[tuple[str, str, str, list[str]]] = []
        self.snapshots: dict[str, dict[str, bytes]] = {}  # commit sha -> the files at that commit (a revision may name it)
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "HubDouble":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def sha(self, repo: str, branch: str) -> str:
        """The commit id of a branch's files (a sha given as the revision stays itself)."""
        if branch not in self.repos[repo] and branch in self.snapshots:
            return branch
        files = self.repos[repo][branch]
        sha = hashlib.sha1(json.dumps([repo, {k: hashlib.sha1(v).hexdigest() for k, v in sorted(files.items())}]).encode()).hexdigest()
        self.snapshots[sha] = dict(files)
        return sha

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body=None, headers: dict | None = None, raw: bytes | None = None) -> None:
                data = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {double.token}":
                    self._send(401, {"error": "Invalid credentials in Authorization header"}, {"X-Error-Code": "InvalidCredentials"})
                    return False
                return True

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _repo(self, repo: str, branch: str):
                files = double.repos.get(repo, {}).get(branch, double.snapshots.get(branch) if repo in double.repos else None)
                if repo not in double.repos:
                    self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                elif files is None:
                    self._send(404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"})
                return files

            def do_POST(self):
                if not self._authorized():
                    return
                path = urlsplit(self.path).path
                with double.lock:
                    if path == "/api/repos/create":
                        p = json.loads(self._body())
                        repo = f"{p['organization']}/{p['name']}" if p.get("organization") else p["name"]
                        if repo in double.repos:
                            return self._send(409, {"error": "You already created this model repo", "url": f"{double.url}/{repo}"})
                        double.repos[repo] = {"main": {}}
                        double.private[repo] = bool(p.get("private")) or p.get("visibility") == "private"
                        return self._send(200, {"url": f"{double.url}/{repo}", "name": repo})
                    if path == "/api/validate-yaml":  # huggingface_hub checks a README's front matter before committing it
                        body = json.loads(self._body())
                        return self._send(200, {"errors": [], "warnings": []} if body.get("content", "").startswith("---") else {"errors": ["no front matter"]})
                    m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/branch/(.+)", path)
                    if m:
                        repo, branch = m.group(1), unquote(m.group(2))
                        self._body()
                        if repo not in double.repos:
                            return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                        if branch in double.repos[repo]:
                            return self._send(409, {"error": "Reference already exists"})
                        double.repos[repo][branch] = dict(double.repos[repo]["main"])
                        return self._send(200, {})
                    m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/(.+)", path)
                    if m:
                        files = json.loads(self._body()).get("files", [])
                        if self._repo(m.group(1), unquote(m.group(2))) is None:
                            return
                        return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]})
                    m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/(.+)", path)
                    if m:
                        repo, branch = m.group(1), unquote(m.group(2))
                        lines = [json.loads(x) for x in self._body().splitlines() if x.strip()]
                        files = self._repo(repo, branch)
                        if files is None:
                            return
                        new = dict(files)
                        summary, paths = "", []
                        for line in lines:
                            key, value = line.get("key"), line.get("value") or {}
                            if key == "header":
                                summary = value.get("summary", "")
                            elif key == "file":
                                new[value["path"]] = base64.b64decode(value["content"])
                                paths.append(value["path"])
                            elif key == "deletedFile":
                                new.pop(value["path"], None)
                            elif key == "deletedFolder":
                                prefix = value["path"].rstrip("/") + "/"
                                new = {k: v for k, v in new.items() if not k.startswith(prefix)}
                            elif key in ("lfsFile", "copyFile"):
                                return self._send(400, {"error": f"the double takes regular files only, not {key}"})
                        double.repos[repo][branch] = new  # all of the commit at once
                        double.commits.append((repo, branch, summary, paths))
                        sha = double.sha(repo, branch)
                        return self._send(200, {"commitUrl": f"{double.url}/{repo}/commit/{sha}", "commitOid": sha, "success": True})
                self._send(404, {"error": f"no such route: POST {path}"})

            def do_GET(self):
                if not self._authorized():
                    return
                url = urlsplit(self.path)
                path = unquote(url.path)
                with double.lock:
                    m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
                    if m:
                        files = self._repo(m.group(1), m.group(2))
                        if files is None:
                            return
                        sub = (m.group(3) or "").strip("/")
                        recursive = parse_qs(url.query).get("recursive", ["false"])[0].lower() == "true"
                        out = [{"type": "file", "path": k, "size": len(v), "oid": _blob_id(v)} for k, v in sorted(files.items())
                               if (not sub or k.startswith(sub + "/")) and (recursive or "/" not in k[len(sub) + 1 if sub else 0:])]
                        return self._send(200, out)
                    m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path)
                    if m:
                        repo, branch = m.group(1), m.group(2)
                        files = self._repo(repo, branch)
                        if files is None:
                            return
                        return self._send(200, {"id": repo, "modelId": repo, "sha": double.sha(repo, branch), "private": double.private[repo],
                                                "siblings": [{"rfilename": k} for k in sorted(files)]})
                    return self._resolve(path)

            def do_HEAD(self):
                if not self._authorized():
                    return
                with double.lock:
                    self._resolve(unquote(urlsplit(self.path).path))

            def _resolve(self, path: str) -> None:
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if not m:
                    return self._send(404, {"error": f"no such route: {self.command} {path}"})
                repo, branch, name = m.groups()
                files = self._repo(repo, branch)
                if files is None:
                    return
                if name not in files:
                    return self._send(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                data = files[name]
                self._send(200, raw=data, headers={"X-Repo-Commit": double.sha(repo, branch), "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})

        return Handler
