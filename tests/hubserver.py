"""A local server that speaks the Hugging Face Hub's protocol, for the download tests.

It answers as huggingface.co does (what ``huggingface_hub`` and llama.cpp read):

- ``GET /api/models/ORG/REPO`` and ``.../revision/REV``: the model's info, with its commit
  (``sha``), ``gated`` and ``siblings`` (``rfilename`` each); ``.../refs`` and
  ``.../tree/REV`` (llama.cpp's calls); an unknown repository is a 401 with
  ``X-Error-Code: RepoNotFound``, an unknown revision a 404 ``RevisionNotFound``.
- ``HEAD``/``GET /ORG/REPO/resolve/REV/PATH``: an LFS file (``*.gguf``) is a 302 to a CDN
  path on another origin (``http://localhost:PORT/cdn/SHA256``) carrying ``X-Repo-Commit``,
  ``X-Linked-Etag`` (its sha256), ``X-Linked-Size`` and an ``ETag`` of the git pointer; a
  small file is a 200 with its git blob sha1 as ``ETag``. A gated repository answers 401
  (no token) or 403 (a token without access) with ``X-Error-Code: GatedRepo``; a missing
  file is a 404 ``EntryNotFound``.
- ``GET /cdn/SHA256``: the bytes, ``Range: bytes=N-`` answered with a 206.

Faults for the tests: ``drop_after[sha256] = n`` closes the connection after n bytes of
the next GET of that blob (once); ``corrupt`` (a set of sha256) serves other bytes of the
same length. ``requests`` records (method, path, headers in lower case) of every request.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlparse


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFile:
    path: Path  # where the bytes are on disk
    size: int
    sha256: str

    @classmethod
    def of(cls, path: Path) -> HubFile:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return cls(Path(path), path.stat().st_size, h.hexdigest())


@dataclass
class HubRepo:
    files: dict[str, HubFile] = field(default_factory=dict)  # repo path -> file
    commit: str = ""
    gated: bool = False


class HubServer:
    """``with HubServer() as hub: hub.add_repo("org/name", {"a.gguf": path}); hub.url``"""

    def __init__(self, token: str = "hf_test_token") -> None:
        self.token = token
        self.repos: dict[str, HubRepo] = {}
        self.drop_after: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.blobs: dict[str, HubFile] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        """The same server under another host name: like the Hub's CDN, another origin, to
        which a client must not send its token."""
        return f"http://localhost:{self._httpd.server_address[1]}"

    def add_repo(self, repo_id: str, files: dict[str, Path], gated: bool = False) -> HubRepo:
        entries = {name: HubFile.of(Path(p)) for name, p in files.items()}
        commit = hashlib.sha1(repo_id.encode() + b"".join(
            e.sha256.encode() for e in entries.values())).hexdigest()
        repo = HubRepo(entries, commit, gated)
        with self._lock:
            self.repos[repo_id] = repo
            for e in entries.values():
                self.blobs[e.sha256] = e
        return repo

    def count(self, method: str, pattern: str) -> int:
        """How many requests of ``method`` had a path matching ``pattern``."""
        with self._lock:
            return sum(1 for m, p, _ in self.requests if m == method and re.search(pattern, p))

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        # -- routing -----------------------------------------------------------------------
        def _route(self, head: bool) -> None:
            path = urlparse(self.path).path
            with hub._lock:
                hub.requests.append((self.command, path,
                                     {k.lower(): v for k, v in self.headers.items()}))
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
                return self._model_info(unquote(m.group(1)), unquote(m.group(2) or "main"))
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/refs", path):
                return self._refs(unquote(m.group(1)))
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path):
                return self._tree(unquote(m.group(1)), unquote(m.group(2)))
            if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                return self._resolve(unquote(m.group(1)), unquote(m.group(2)),
                                     unquote(m.group(3)), head)
            if m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
                return self._cdn(m.group(1), head)
            self._error(404, "NotFound", "no such route")

        def _repo(self, repo_id: str, revision: str) -> HubRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(401, "RepoNotFound", "Repository not found")
                return None
            if revision not in ("main", repo.commit):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return None
            return repo

        # -- the API ---------------------------------------------------------------------
        def _model_info(self, repo_id: str, revision: str) -> None:
            if (repo := self._repo(repo_id, revision)) is None:
                return
            self._json({
                "_id": repo.commit[:24], "id": repo_id, "modelId": repo_id,
                "author": repo_id.split("/")[0], "sha": repo.commit,
                "lastModified": "2026-01-01T00:00:00.000Z", "private": False,
                "disabled": False, "gated": "auto" if repo.gated else False,
                "downloads": 0, "likes": 0, "tags": ["gguf"], "library_name": "gguf",
                "createdAt": "2026-01-01T00:00:00.000Z",
                "siblings": [{"rfilename": name} for name in repo.files],
            })

        def _refs(self, repo_id: str) -> None:
            if (repo := self._repo(repo_id, "main")) is None:
                return
            self._json({"branches": [{"name": "main", "ref": "refs/heads/main",
                                      "targetCommit": repo.commit}],
                        "tags": [], "converts": []})

        def _tree(self, repo_id: str, revision: str) -> None:
            if (repo := self._repo(repo_id, revision)) is None:
                return
            self._json([{"type": "file", "path": name, "size": f.size,
                         "oid": _pointer_oid(f),
                         "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134}}
                        for name, f in repo.files.items()])

        # -- files -----------------------------------------------------------------------
        def _resolve(self, repo_id: str, revision: str, name: str, head: bool) -> None:
            if (repo := self._repo(repo_id, revision)) is None:
                return
            if repo.gated and not self._authorized():
                code = 403 if self.headers.get("Authorization") else 401
                return self._error(code, "GatedRepo",
                                   f"Access to model {repo_id} is restricted. You must have "
                                   "access to it and be authenticated to access it.")
            f = repo.files.get(name)
            if f is None:
                return self._error(404, "EntryNotFound", f"{name} does not exist")
            common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
            if name.endswith(".gguf"):  # LFS: redirect to the CDN, as the Hub does
                body = b"Found. Redirecting to /cdn/" + f.sha256.encode()
                self._send(302, {**common, "Location": f"{hub.cdn_url}/cdn/{f.sha256}?filename="
                                 f"{quote(name.rsplit('/', 1)[-1])}",
                                 "X-Linked-Etag": f'"{f.sha256}"',
                                 "X-Linked-Size": str(f.size),
                                 "ETag": f'"{_pointer_oid(f)}"',
                                 "Content-Type": "text/plain; charset=utf-8"}, body, head)
                return
            data = f.path.read_bytes()
            self._send(200, {**common, "ETag": f'"{git_blob_sha1(data)}"',
                             "Content-Type": "application/octet-stream"}, data, head)

        def _authorized(self) -> bool:
            return self.headers.get("Authorization") == f"Bearer {hub.token}"

        def _cdn(self, sha: str, head: bool) -> None:
            f = hub.blobs.get(sha)
            if f is None:
                return self._error(404, "EntryNotFound", "no such blob")
            start = 0
            if m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
                start = int(m.group(1))
                if start >= f.size:
                    return self._send(416, {"Content-Range": f"bytes */{f.size}"}, b"", head)
            headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
                       "ETag": f'"{sha}"', "Content-Length": str(f.size - start)}
            if start:
                headers["Content-Range"] = f"bytes {start}-{f.size - 1}/{f.size}"
            self.send_response(206 if start else 200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if head:
                return
            with hub._lock:
                drop = hub.drop_after.pop(sha, None)
                corrupt = sha in hub.corrupt
            self._stream(f, start, drop, corrupt)

        def _stream(self, f: HubFile, start: int, drop: int | None, corrupt: bool) -> None:
            sent = 0
            with open(f.path, "rb") as src:
                src.seek(start)
                while chunk := src.read(1 << 16):
                    if corrupt:
                        chunk = bytes(b ^ 0x5A for b in chunk)
                    if drop is not None and sent + len(chunk) > drop:
                        self.wfile.write(chunk[: drop - sent])
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    self.wfile.write(chunk)
                    sent += len(chunk)

        # -- responses -------------------------------------------------------------------
        def _json(self, value: object) -> None:
            self._send(200, {"Content-Type": "application/json; charset=utf-8"},
                       json.dumps(value).encode(), self.command == "HEAD")

        def _error(self, code: int, error_code: str, message: str) -> None:
            self._send(code, {"Content-Type": "application/json; charset=utf-8",
                              "X-Error-Code": error_code, "X-Error-Message": message},
                       json.dumps({"error": message}).encode(), self.command == "HEAD")

        def _send(self, code: int, headers: dict[str, str], body: bytes, head: bool) -> None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

    return Handler


def _pointer_oid(f: HubFile) -> str:
    """The git blob sha1 of the file's LFS pointer (what the Hub's ``ETag`` is for it)."""
    pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{f.sha256}\n"
               f"size {f.size}\n").encode()
    return git_blob_sha1(pointer)
