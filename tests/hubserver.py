"""A fake Hugging Face Hub: a real HTTP server on 127.0.0.1 speaking the endpoints huggingface_hub 0.36 uses.

Usage::

    from hubserver import FakeRepo, HubServer, use_hub   # tests/ is on sys.path under pytest

    def test_x(monkeypatch, tmp_path):
        repo = FakeRepo({"config.json": b"{}", "model.safetensors": b"..."}, tags={"v1": None})
        with HubServer({"org/model": repo}) as hub:
            use_hub(monkeypatch, hub, tmp_path / "hf")
            path = hf_hub_download("org/model", "config.json")        # in-process: goes to hub.url
            subprocess.run([sys.executable, "-c", ...], check=True)   # inherits HF_ENDPOINT=hub.url
            assert hub.downloads == ["/org/model/resolve/main/config.json"]

Pointing the client at the server
---------------------------------
huggingface_hub copies ``HF_ENDPOINT`` into ``constants.ENDPOINT`` / ``constants.HUGGINGFACE_CO_URL_TEMPLATE``
when it is first imported, and some modules keep their own copy (``file_download.HUGGINGFACE_CO_URL_TEMPLATE``
is what ``hf_hub_url`` formats; ``hf_api.api`` is an ``HfApi`` built at import). So:

* in-process: call ``use_hub(monkeypatch, server, hf_home)``. It sets the environment (``HF_ENDPOINT``,
  ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_DISABLE_TELEMETRY=1``, ``NO_PROXY``; unsets ``HF_TOKEN``,
  ``HF_HUB_OFFLINE``...) and monkeypatches every already-imported copy of the endpoint/cache/token-path constants
  in ``huggingface_hub.*`` (all restored at teardown). Alternatively pass ``endpoint=server.url`` to ``HfApi``,
  ``hf_hub_download`` and ``snapshot_download`` explicitly (plus ``cache_dir=``).
* subprocesses: they inherit ``os.environ`` as set by ``use_hub`` and import huggingface_hub afresh, so
  ``HF_ENDPOINT`` is read at import there. Pass ``env={**os.environ, "HF_TOKEN": ..., "HF_HUB_OFFLINE": "1"}``
  for variations. ``server.env()`` returns the same variables as a dict for a hand-built environment.

What is served (as the real hub does, for model repos only; no Xet headers, so the classic LFS path is used)
--------------------------------------------------------------------------------------------------------
* ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` (``model_info``/``repo_info``):
  ``id, sha, siblings[{rfilename}]``; with ``?blobs=true`` (``files_metadata=True``) siblings also carry
  ``size, blobId, lfs{sha256,size,pointerSize}``. ``?expand=`` keeps only the listed keys.
* ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=&expand=`` (``list_repo_tree``):
  ``[{type: file|directory, oid, size, path, lfs{oid,size,pointerSize}, lastCommit?}]``.
* ``GET /api/models/{repo}/refs`` (``list_repo_refs``): ``branches, converts, tags, pullRequests``.
* ``HEAD|GET /{repo}/resolve/{rev}/{path}`` (``hf_hub_download``): regular files answer 200 with ``ETag: "<git
  blob id>"``, ``Content-Length``, ``X-Repo-Commit``; LFS files answer 302 to ``/cdn-lfs/{sha256}`` (like the
  hub's redirect to its CDN) with ``X-Linked-Etag: "<sha256>"``, ``X-Linked-Size``, ``X-Repo-Commit``.
  GETs honour ``Range: bytes=a-b`` (206 + ``Content-Range``; 416 when unsatisfiable), which the client uses to
  resume ``*.incomplete`` blobs.
* Errors carry ``X-Error-Code`` / ``X-Error-Message`` headers (what ``utils/_http.py:hf_raise_for_status`` maps):
  unknown repo 401 ``RepoNotFound`` (404 when a token is sent), unknown revision 404 ``RevisionNotFound``,
  missing file 404 ``EntryNotFound`` (with ``X-Repo-Commit``), gated repo 401 ``GatedRepo`` without a token and
  403 ``GatedRepo`` with a wrong one. As on the hub, a gated repo's metadata (``/api/...``) stays public; only
  file content (``resolve``) needs ``Authorization: Bearer <gated_token>``.

Hashes are git's: ``blobId`` is the git blob id of what git stores, i.e. of the content for regular files and of
the LFS pointer file for LFS files (as on the hub); an LFS file's ``sha256`` (and cache blob name) is the
content's sha256. Folder ``oid`` are real git tree ids and default commit ids real git commit ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")
LFS_MIN_SIZE = 10 * 1024 * 1024
DATE = "2024-01-01T00:00:00.000Z"
_EPOCH = 1704067200  # DATE as a unix timestamp, for commit objects


# --------------------------------------------------------------------------- git hashing


def git_blob_id(data: bytes) -> str:
    """git's blob id: sha1 of ``b"blob {len}\\0" + data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """The git-lfs pointer file git stores instead of an LFS file's content."""
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
            f"size {len(data)}\n").encode()


def _tree_id(entries: dict[str, tuple[bool, str]]) -> str:
    """git tree id of {name: (is_dir, oid)}; git sorts directories as if their name ended with '/'."""
    body = b""
    for name in sorted(entries, key=lambda n: n + "/" if entries[n][0] else n):
        is_dir, oid = entries[name]
        body += b"%s %s\0" % (b"40000" if is_dir else b"100644", name.encode()) + bytes.fromhex(oid)
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def _commit_id(tree: str, parent: str | None, message: str = "Upload files") -> str:
    who = f"hubserver <hubserver@localhost> {_EPOCH} +0000"
    text = f"tree {tree}\n" + (f"parent {parent}\n" if parent else "") + f"author {who}\ncommitter {who}\n\n{message}\n"
    return hashlib.sha1(b"commit %d\0" % len(text.encode()) + text.encode()).hexdigest()


# --------------------------------------------------------------------------- repos


class _Snapshot:
    """The files of one commit, with per-file hashes and git tree ids (computed once)."""

    def __init__(self, files: dict[str, bytes], is_lfs) -> None:
        self.files = dict(files)
        self.lfs = {p for p, d in self.files.items() if is_lfs(p, d)}
        self.blob_id = {p: git_blob_id(lfs_pointer(d) if p in self.lfs else d) for p, d in self.files.items()}
        self.sha256 = {p: hashlib.sha256(self.files[p]).hexdigest() for p in self.lfs}
        self.dirs = {"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)}
        self.tree_id: dict[str, str] = {}
        for d in sorted(self.dirs | {""}, key=lambda d: -d.count("/") - (d != "")):  # deepest first
            self.tree_id[d] = _tree_id({name: (full in self.dirs, self.tree_id.get(full) or self.blob_id[full])
                                        for full, name in self._children(d)})

    def _children(self, folder: str):
        prefix = folder + "/" if folder else ""
        for full in sorted(self.dirs | set(self.files)):
            if full.startswith(prefix) and "/" not in full[len(prefix):]:
                yield full, full[len(prefix):]

    def entry(self, path: str) -> dict:
        """A tree entry as ``/api/models/{repo}/tree`` returns it."""
        if path in self.dirs:
            return {"type": "directory", "oid": self.tree_id[path], "size": 0, "path": path}
        e = {"type": "file", "oid": self.blob_id[path], "size": len(self.files[path]), "path": path}
        if path in self.lfs:
            e["lfs"] = {"oid": self.sha256[path], "size": len(self.files[path]),
                        "pointerSize": len(lfs_pointer(self.files[path]))}
        return e


@dataclass
class FakeRepo:
    """A model repo: the files at its head commit, its refs, and who may download it.

    files:       path in repo -> content, at commit ``commit``.
    commit:      40-hex id of that commit; default: a git commit id derived from the content.
    branches:    branch -> commit id; default ``{"main": commit}``. The first branch is the default branch.
    tags:        tag -> commit id (``None`` means ``commit``).
    lfs:         paths stored in LFS; default: ``*.safetensors``, ``*.bin``, ``*.gguf`` and files over 10 MB.
    gated_token: if set, downloads need ``Authorization: Bearer <gated_token>`` (GatedRepo errors otherwise).
    history:     older commits, still reachable by id, branch or tag: commit id -> files (``HubServer.push``
                 fills it when it moves a branch).
    """

    files: dict[str, bytes]
    commit: str | None = None
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str | None] = field(default_factory=dict)
    lfs: set[str] | None = None
    gated_token: str | None = None
    history: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._snapshots: dict[str, _Snapshot] = {}
        if self.commit is None:
            self.commit = _commit_id(_Snapshot(self.files, self.is_lfs).tree_id[""], None)
        self.branches = self.branches or {"main": self.commit}
        self.tags = {t: c or self.commit for t, c in self.tags.items()}
        for ref, target in {**self.branches, **self.tags}.items():
            if target != self.commit and target not in self.history:
                raise ValueError(f"ref {ref!r} points to unknown commit {target!r}")

    def is_lfs(self, path: str, data: bytes) -> bool:
        if self.lfs is not None:
            return path in self.lfs
        return path.endswith(LFS_SUFFIXES) or len(data) > LFS_MIN_SIZE

    def snapshot(self, commit: str | None) -> _Snapshot:
        """Files and hashes at ``commit`` (None: the head commit)."""
        files = self.files if commit is None or commit == self.commit else self.history[commit]
        key = commit or self.commit
        snap = self._snapshots.get(key)
        if snap is None or snap.files != files:
            snap = self._snapshots[key] = _Snapshot(files, self.is_lfs)
        return snap

    def resolve(self, revision: str) -> str | None:
        """Commit id for a branch, tag or full commit id (also ``refs/heads/x``, ``refs/tags/x``); else None."""
        rev = revision.removeprefix("refs/heads/").removeprefix("refs/tags/")
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        if rev == self.commit or rev in self.history:
            return rev
        return None


class Call(NamedTuple):
    """One request served: ``path`` is percent-decoded, without the query; ``headers`` have lower-case keys;
    ``content`` is True when file bytes were sent (a download, as opposed to metadata/HEAD/redirect/error)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    status: int
    content: bool


# --------------------------------------------------------------------------- server


class HubServer:
    """Serves ``repos`` (repo_id -> FakeRepo) on http://127.0.0.1:<free port> from a background thread.

    Use as a context manager (or ``start()``/``stop()``). ``repos`` may be changed while running, directly or
    through ``add_repo`` / ``push``.
    """

    def __init__(self, repos: dict[str, FakeRepo] | None = None) -> None:
        self.repos: dict[str, FakeRepo] = dict(repos or {})
        self.calls: list[Call] = []
        self.url = ""
        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle
    def start(self) -> "HubServer":
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.hub = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="hubserver",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- what was served
    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path) of every request served, in order."""
        return [(c.method, c.path) for c in self.calls]

    @property
    def downloads(self) -> list[str]:
        """Paths of the GETs that sent file content (``/{repo}/resolve/...`` or ``/cdn-lfs/{sha256}``)."""
        return [c.path for c in self.calls if c.content]

    def clear(self) -> None:
        """Forget the requests served so far."""
        self.calls.clear()

    # ---- changing the repos while running
    def add_repo(self, repo_id: str, repo: FakeRepo) -> FakeRepo:
        """Add or replace a repo."""
        with self._lock:
            self.repos[repo_id] = repo
        return repo

    def push(self, repo_id: str, files: dict[str, bytes], branch: str = "main", commit: str | None = None) -> str:
        """Commit ``files`` (the full new file set) on top of ``branch`` and move the branch there.

        The previous head stays reachable by its commit id (and by any other ref pointing at it).
        Returns the new commit id (``commit`` or a git commit id derived from the content and the parent).
        """
        with self._lock:
            repo = self.repos[repo_id]
            parent = repo.branches.get(branch)
            snap = _Snapshot(files, repo.is_lfs)
            new = commit or _commit_id(snap.tree_id[""], parent)
            repo.history[repo.commit] = repo.files
            repo.history.pop(new, None)
            repo.files, repo.commit = dict(files), new
            repo.branches[branch] = new
            return new

    def env(self, hf_home: str | os.PathLike) -> dict[str, str]:
        """Environment variables that point a fresh huggingface_hub (e.g. in a subprocess) at this server."""
        return _env(self, Path(hf_home))

    # ---- internals used by the handler
    def _find_lfs_blob(self, sha256: str) -> bytes | None:
        with self._lock:
            for repo in self.repos.values():
                for commit in [repo.commit, *repo.history]:
                    snap = repo.snapshot(commit)
                    for path, digest in snap.sha256.items():
                        if digest == sha256:
                            return snap.files[path]
        return None


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_REPO_KEYWORDS = {"revision", "tree", "refs", "resolve", "paths-info", "commits"}


def _truthy(query: dict, name: str) -> bool:
    return any(v.lower() in ("1", "true") for v in query.get(name, []))


class _Handler(BaseHTTPRequestHandler):
    server_version = "hubserver"

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _serve(self) -> None:
        split = urlsplit(self.path)
        segs = [unquote(s) for s in split.path.split("/")[1:]]
        self._query = parse_qs(split.query)
        self._status, self._content, self._recorded = 500, False, False
        self._split = split
        try:
            if segs[:2] == ["api", "models"] and len(segs) > 2:
                self._api(segs[2:])
            elif len(segs) == 2 and segs[0] == "cdn-lfs":
                self._cdn(segs[1])
            else:
                self._resolve(segs)
        except _HubError as e:
            headers = {"X-Error-Message": e.message, **e.headers}
            if e.code:
                headers["X-Error-Code"] = e.code
            self._reply(e.status, json.dumps({"error": e.message}).encode(), "application/json", headers)
        finally:
            if not self._recorded:  # no reply was sent (a crash in the fake itself)
                self._record()

    def _record(self) -> None:
        # Recorded before the reply goes out: a client that has its answer must find its request in
        # hub.requests (recording afterwards raced with tests reading it on a loaded machine).
        self._recorded = True
        self.hub.calls.append(Call(self.command, unquote(self._split.path), self._query,
                                   {k.lower(): v for k, v in self.headers.items()}, self._status, self._content))

    # ---- responses
    def _reply(self, status: int, body: bytes, ctype: str, headers: dict | None = None,
               content: bool = False) -> None:
        self._status, self._content = status, content and self.command == "GET"
        self._record()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data) -> None:
        self._reply(200, json.dumps(data).encode(), "application/json; charset=utf-8")

    def _file(self, data: bytes, headers: dict, filename: str) -> None:
        """200 with the bytes, or 206/416 for a ``Range`` request."""
        headers = {"Accept-Ranges": "bytes",
                   "Content-Disposition": f"inline; filename*=UTF-8''{quote(filename)}; filename=\"{filename}\";",
                   **headers}
        match = _RANGE.match(self.headers.get("Range", "").strip())
        if match and match.group(1) + match.group(2):
            start, end, total = match.group(1), match.group(2), len(data)
            if start:
                first, last = int(start), min(int(end) if end else total - 1, total - 1)
            else:
                first, last = max(total - int(end), 0), total - 1
            if first >= total or first > last:
                self._reply(416, b"", "text/plain", {"Content-Range": f"bytes */{total}"})
                return
            self._reply(206, data[first:last + 1], "application/octet-stream",
                        {**headers, "Content-Range": f"bytes {first}-{last}/{total}"}, content=True)
            return
        self._reply(200, data, "application/octet-stream", headers, content=True)

    # ---- lookups shared by the endpoints
    def _repo(self, segs: list[str]) -> tuple[str, FakeRepo | None, list[str]]:
        """Split API path segments into (repo_id, repo or None, rest): a known repo id, else 'namespace/name'."""
        for n in (2, 1):
            if "/".join(segs[:n]) in self.hub.repos and len(segs) >= n:
                return "/".join(segs[:n]), self.hub.repos["/".join(segs[:n])], segs[n:]
        n = 1 if len(segs) < 2 or segs[1] in _REPO_KEYWORDS else 2
        return "/".join(segs[:n]), None, segs[n:]

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _need_repo(self, repo_id: str, repo: FakeRepo | None) -> FakeRepo:
        if repo is None:
            # The hub answers 401 to anonymous requests for missing (or private) repos, 404 to authenticated ones.
            raise _HubError(404 if self._token() else 401, "RepoNotFound", "Repository not found")
        return repo

    def _need_access(self, repo_id: str, repo: FakeRepo) -> None:
        if repo.gated_token is None:
            return
        token = self._token()
        if token is None:
            raise _HubError(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                                              "and be authenticated to access it. Please log in.")
        if token != repo.gated_token:
            raise _HubError(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                                              f"authorized list. Visit {self.hub.url}/{repo_id} to ask for access.")

    def _need_commit(self, repo: FakeRepo, revision: str) -> str:
        commit = repo.resolve(revision)
        if commit is None:
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    # ---- /api/models/...
    def _api(self, segs: list[str]) -> None:
        repo_id, repo, rest = self._repo(segs)
        repo = self._need_repo(repo_id, repo)
        default = next(iter(repo.branches))
        if not rest or rest[0] == "revision":
            revision = "/".join(rest[1:]) or default
            self._json(self._model_info(repo_id, repo, self._need_commit(repo, revision)))
        elif rest[0] == "tree" and len(rest) >= 2:
            commit = self._need_commit(repo, rest[1])
            self._json(self._tree(repo, commit, "/".join(rest[2:]).strip("/")))
        elif rest == ["refs"]:
            def refs(kind: str, names: dict) -> list:
                return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": c} for n, c in names.items()]
            data = {"branches": refs("heads", repo.branches), "converts": [], "tags": refs("tags", repo.tags)}
            if _truthy(self._query, "include_prs"):
                data["pullRequests"] = []
            self._json(data)
        else:
            raise _HubError(404, None, "Sorry, we can't find the page you are looking for.")

    def _model_info(self, repo_id: str, repo: FakeRepo, commit: str) -> dict:
        snap = repo.snapshot(commit)
        blobs = _truthy(self._query, "blobs")
        siblings = []
        for path in sorted(snap.files):
            sibling: dict = {"rfilename": path}
            if blobs:
                sibling.update(size=len(snap.files[path]), blobId=snap.blob_id[path])
                if path in snap.lfs:
                    sibling["lfs"] = {"sha256": snap.sha256[path], "size": len(snap.files[path]),
                                      "pointerSize": len(lfs_pointer(snap.files[path]))}
            siblings.append(sibling)
        info = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else None, "sha": commit,
            "lastModified": DATE, "createdAt": DATE, "private": False,
            "gated": "manual" if repo.gated_token else False, "disabled": False,
            "downloads": 0, "likes": 0, "tags": [], "library_name": None, "siblings": siblings, "spaces": [],
            "usedStorage": sum(len(d) for d in snap.files.values()),
        }
        expand = self._query.get("expand")
        if expand:
            info = {k: v for k, v in info.items() if k in ("_id", "id") or k in expand}
        return info

    def _tree(self, repo: FakeRepo, commit: str, folder: str) -> list:
        snap = repo.snapshot(commit)
        if folder and folder not in snap.dirs:
            raise _HubError(404, "EntryNotFound", f"{folder} does not exist on \"{commit}\"",
                            {"X-Repo-Commit": commit})
        prefix = folder + "/" if folder else ""
        recursive = _truthy(self._query, "recursive")
        paths = [p for p in sorted(snap.dirs | set(snap.files))
                 if p.startswith(prefix) and (recursive or "/" not in p[len(prefix):])]
        entries = [snap.entry(p) for p in paths]
        if _truthy(self._query, "expand"):
            for e in entries:
                e["lastCommit"] = {"id": commit, "title": "Upload files", "date": DATE}
        return entries

    # ---- /{repo}/resolve/{revision}/{path} and the LFS "CDN"
    def _resolve(self, segs: list[str]) -> None:
        # /{namespace}/{name}/resolve/... or /{name}/resolve/...: prefer a split that names a known repo.
        splits = [n for n in (2, 1) if len(segs) > n and segs[n] == "resolve"]
        if not splits:
            raise _HubError(404, None, "Sorry, we can't find the page you are looking for.")
        n = next((n for n in splits if "/".join(segs[:n]) in self.hub.repos), splits[0])
        repo_id, rest = "/".join(segs[:n]), segs[n:]
        repo = self._need_repo(repo_id, self.hub.repos.get(repo_id))
        self._need_access(repo_id, repo)
        if len(rest) < 3:
            raise _HubError(404, "EntryNotFound", "Entry not found")
        commit = self._need_commit(repo, rest[1])
        path = "/".join(rest[2:])
        snap = repo.snapshot(commit)
        if path not in snap.files:
            raise _HubError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
        data = snap.files[path]
        if path in snap.lfs:
            sha = snap.sha256[path]
            location = f"{self.hub.url}/cdn-lfs/{sha}"
            self._reply(302, f"Found. Redirecting to {location}".encode(), "text/plain; charset=utf-8",
                        {"Location": location, "X-Repo-Commit": commit,
                         "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": len(data)})
            return
        self._file(data, {"ETag": f'"{snap.blob_id[path]}"', "X-Repo-Commit": commit}, path.rsplit("/", 1)[-1])

    def _cdn(self, sha256: str) -> None:
        data = self.hub._find_lfs_blob(sha256)
        if data is None:
            raise _HubError(404, None, "NoSuchKey")
        self._file(data, {"ETag": f'"{sha256}"'}, sha256)


# --------------------------------------------------------------------------- pointing the client at a server

# huggingface_hub.constants names that other modules copy at import, and the value each gets.
def _constant_values(server: HubServer, hf_home: Path) -> dict[str, object]:
    hub_cache = str(hf_home / "hub")
    return {
        "ENDPOINT": server.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": server.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(hf_home),
        "hf_cache_home": str(hf_home),
        "HF_HUB_CACHE": hub_cache,
        "HUGGINGFACE_HUB_CACHE": hub_cache,
        "default_cache_path": hub_cache,
        "HF_ASSETS_CACHE": str(hf_home / "assets"),
        "HF_XET_CACHE": str(hf_home / "xet"),
        "HF_TOKEN_PATH": str(hf_home / "token"),
        "HF_STORED_TOKENS_PATH": str(hf_home / "stored_tokens"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_ENABLE_HF_TRANSFER": False,
    }


def _env(server: HubServer, hf_home: Path) -> dict[str, str]:
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1", "localhost"]))
    return {"HF_ENDPOINT": server.url, "HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "NO_PROXY": no_proxy, "no_proxy": no_proxy}


_UNSET = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
          "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HF_XET_CACHE", "HF_HUB_ENABLE_HF_TRANSFER",
          "HUGGINGFACE_CO_STAGING")


def use_hub(monkeypatch, server: HubServer, hf_home: str | os.PathLike) -> dict[str, str]:
    """Point huggingface_hub, in this process and in subprocesses started afterwards, at ``server``.

    Sets HF_ENDPOINT, HF_HOME, HF_HUB_CACHE (``hf_home/hub``), HF_HUB_DISABLE_TELEMETRY=1, NO_PROXY; unsets
    HF_TOKEN, HF_HUB_OFFLINE and other overrides; then patches ``huggingface_hub.constants`` and every copy of those
    constants already imported into ``huggingface_hub.*`` modules (and the module-level ``hf_api.api`` client),
    and resets the client's cached HTTP sessions. Everything is undone by ``monkeypatch`` at teardown.
    Returns the environment variables it set.
    """
    import sys

    import huggingface_hub.file_download  # noqa: F401  (import the modules holding copies before patching)
    import huggingface_hub.hf_api
    import huggingface_hub.utils._cache_assets  # noqa: F401
    import huggingface_hub.utils._cache_manager  # noqa: F401
    from huggingface_hub import constants
    from huggingface_hub.utils import reset_sessions

    hf_home = Path(hf_home)
    env = _env(server, hf_home)
    for name in _UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    values = _constant_values(server, hf_home)
    originals = {name: getattr(constants, name) for name in values if hasattr(constants, name)}
    for modname, module in list(sys.modules.items()):
        if module is None or not (modname == "huggingface_hub" or modname.startswith("huggingface_hub.")):
            continue
        for name, original in originals.items():
            if name in vars(module) and vars(module)[name] == original:
                monkeypatch.setattr(module, name, values[name])
    api = huggingface_hub.hf_api.api
    if api.endpoint == originals["ENDPOINT"]:
        monkeypatch.setattr(api, "endpoint", server.url)
    reset_sessions()  # sessions are cached per thread and bake in HF_HUB_OFFLINE
    return env
