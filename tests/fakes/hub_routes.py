"""The fake Hub's endpoints: one method per operation, answering as huggingface_hub 2.4 expects.

Errors carry the Hub's `X-Error-Code` header (RepoNotFound, RevisionNotFound, EntryNotFound): the client
picks its exception from that header (its URL-based fallback for 401s only matches https endpoints).
A missing repo, or a private one asked for without a token, is RepoNotFound: 401 when the request had no
token, 404 when it had one, as the Hub does, so that nobody learns which private repos exist.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from tests.fakes.hub_store import (
    REPO_TYPES,
    URL_PREFIXES,
    Blob,
    Commit,
    Repo,
    RepoStore,
    iso_time,
    lfs_pointer,
    wants_lfs,
)
from tests.fakes.hub_tokens import TokenScope
from tests.fakes.hub_wire import FileBody, HubRequest, Refused, Reply, parse_range

if TYPE_CHECKING:
    from tests.fakes.hub_cdn import HubCdn

REPO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
SHA256 = re.compile(r"[0-9a-f]{64}")
_LFS_JSON = {"Content-Type": "application/vnd.git-lfs+json"}


@dataclass
class Target:
    """What a request's path names: a repo, a revision, and a file or folder path (or an upload ticket)."""

    repo_type: str = "model"
    repo_id: str = ""
    revision: str = "main"
    path: str = ""


def hub_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Refused:
    """An error the client recognises by its X-Error-Code header."""
    extra = {"X-Error-Code": code, "X-Error-Message": message, **(headers or {})}
    return Refused(Reply(status, {"error": message}, extra))


def tree_entries(files: dict[str, Blob], prefix: str, recursive: bool) -> list[dict[str, Any]]:
    """The /tree listing of `prefix`: folders first, then files, as RepoFile / RepoFolder expect them."""
    base = f"{prefix}/" if prefix else ""
    folders: set[str] = set()
    rows = []
    for path, blob in sorted(files.items()):
        if not path.startswith(base):
            continue
        parts = path[len(base) :].split("/")
        if not recursive and len(parts) > 1:
            folders.add(base + parts[0])
            continue
        folders.update(base + "/".join(parts[:i]) for i in range(1, len(parts)))
        row: dict[str, Any] = {"type": "file", "oid": blob.git_oid, "size": blob.size, "path": path}
        if blob.lfs:
            pointer_size = len(lfs_pointer(blob.sha256, blob.size))
            row["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": pointer_size}
        rows.append(row)
    dirs = [
        {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
        for d in sorted(folders)
    ]
    return dirs + rows


def decode_commit(payload: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Split an NDJSON commit payload into its header value and its operations ({"key", "value"})."""
    header: dict[str, Any] = {}
    operations = []
    for line in payload.splitlines():
        if line.strip():
            item = json.loads(line)
            if item.get("key") == "header":
                header = dict(item.get("value") or {})
            else:
                operations.append(item)
    return header, operations


def decode_content(value: dict[str, Any]) -> bytes:
    """The bytes of a regular "file" operation (base64, or plain text)."""
    content = str(value.get("content", ""))
    if value.get("encoding") != "base64":
        return content.encode()
    try:
        return base64.b64decode(content, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"bad base64 content for {value.get('path')!r}") from exc


class HubRoutes:
    """The Hub's endpoints over a `RepoStore`; `FakeHub` routes requests to these methods."""

    def __init__(self, store: RepoStore, token: str, user: str) -> None:
        self.store = store
        self.token = token  # the user's write token
        self.user = user
        self.orgs: list[str] = []
        self.tokens: dict[str, TokenScope] = {token: TokenScope("write", frozenset({user}))}
        self._tickets: dict[str, tuple[str, int]] = {}  # LFS upload URL ticket -> (sha256, size)
        self._tickets_lock = threading.Lock()
        self.cdn: HubCdn | None = None  # where LFS files are served from (FakeHub starts one)

    def url_path(self, repo: Repo) -> str:
        """The repo's web path: "ns/name", "datasets/ns/name" or "spaces/ns/name"."""
        return f"{URL_PREFIXES[repo.repo_type]}{repo.repo_id}"

    # -- access ------------------------------------------------------------------------------------
    def bearer(self, request: HubRequest) -> str:
        """The Bearer token of a request ('' if none)."""
        auth = request.headers.get("authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""

    def authorized(self, request: HubRequest) -> bool:
        """Whether the request carries a valid token."""
        return self.bearer(request) in self.tokens

    def require_token(self, request: HubRequest) -> None:
        """Refuse a request without the token (a wrong one was refused before routing)."""
        if not self.authorized(request):
            message = "You must be authenticated (Authorization: Bearer <token>) to do this"
            raise Refused(Reply(401, {"error": message}, {"X-Error-Message": message}))

    def readable(self, request: HubRequest, target: Target) -> Repo:
        """The target repo, if this request may read it."""
        repo = self.store.get(target.repo_type, target.repo_id)
        authed = self.authorized(request)
        if repo is None or (repo.private and not authed):
            raise hub_error(404 if authed else 401, "RepoNotFound", "Repository not found")
        return repo

    def writable(self, request: HubRequest, target: Target) -> Repo:
        """The target repo, if this request may write to it."""
        repo = self.readable(request, target)
        self.require_write(request, repo.repo_id.split("/")[0], f"write to {repo.repo_id}")
        return repo

    def require_write(self, request: HubRequest, namespace: str, what: str) -> None:
        """Refuse (403, the Hub's reason) a request whose token may not write in `namespace`."""
        self.require_token(request)
        why = self.tokens[self.bearer(request)].refusal(namespace, what)
        if why is not None:
            raise Refused(Reply(403, {"error": why}, {"X-Error-Message": why}))

    def commit_at(self, repo: Repo, revision: str) -> Commit:
        """The commit a revision names, or RevisionNotFound."""
        commit = repo.resolve(revision)
        if commit is None:
            raise hub_error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    # -- account and repos -------------------------------------------------------------------------
    def whoami(self, request: HubRequest, target: Target) -> Reply:
        """GET /api/whoami-v2."""
        self.require_token(request)
        auth = self.tokens[self.bearer(request)].whoami_auth("fake-hub")
        user = {"type": "user", "id": "fake0001", "name": self.user, "fullname": "Fake Hub User"}
        orgs = [{"type": "org", "name": org, "roleInOrg": "write"} for org in self.orgs]
        return Reply(200, {**user, "isPro": False, "orgs": orgs, "auth": auth})

    def validate_yaml(self, request: HubRequest, target: Target) -> Reply:
        """POST /api/validate-yaml (upload_folder sends a README.md's metadata here first): 400 with the
        errors when the front matter is not a YAML mapping, as the Hub refuses such a card."""
        content = str((request.json() or {}).get("content") or "")
        match = re.match(r"\A---\n(.*?)\n---\n", content, re.DOTALL)
        if match is None:
            return Reply(200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata"}]})
        try:
            data = yaml.safe_load(match.group(1))
        except yaml.YAMLError as exc:
            return Reply(400, {"errors": [{"message": f"invalid YAML: {exc}"}], "warnings": []})
        if not isinstance(data, dict):
            return Reply(400, {"errors": [{"message": "metadata must be a YAML mapping"}], "warnings": []})
        return Reply(200, {"errors": [], "warnings": []})

    def create_repo(self, request: HubRequest, target: Target) -> Reply:
        """POST /api/repos/create: 409 when it exists (the client's exist_ok relies on that)."""
        self.require_token(request)
        body = request.json() or {}
        name, namespace = str(body.get("name", "")), str(body.get("organization") or self.user)
        repo_type = str(body.get("type") or "model")
        self.require_write(request, namespace, f"create a {repo_type}")
        if repo_type not in REPO_TYPES or not REPO_NAME.fullmatch(name) or not REPO_NAME.fullmatch(namespace):
            return Reply(400, {"error": f"Invalid repo name or type: {namespace}/{name} ({repo_type})"})
        private = body.get("visibility", "private" if body.get("private") else "public") == "private"
        repo, created = self.store.create(repo_type, f"{namespace}/{name}", private)
        url = f"{request.base_url}/{self.url_path(repo)}"
        if not created:
            return Reply(409, {"error": f"You already created this {repo_type} repo", "url": url})
        return Reply(200, {"url": url, "name": repo.repo_id, "id": repo.repo_id})

    def delete_repo(self, request: HubRequest, target: Target) -> Reply:
        """DELETE /api/repos/delete."""
        body = request.json() or {}
        repo_id = f"{body.get('organization') or self.user}/{body.get('name')}"
        self.require_write(request, repo_id.split("/")[0], f"delete {repo_id}")
        if not self.store.delete(str(body.get("type") or "model"), repo_id):
            raise hub_error(404, "RepoNotFound", "Repository not found")
        return Reply(200, {})

    def repo_info(self, request: HubRequest, target: Target) -> Reply:
        """GET /api/{type}s/{repo}[/revision/{rev}]: ModelInfo / DatasetInfo; sizes with ?blobs=true."""
        repo = self.readable(request, target)
        commit = self.commit_at(repo, target.revision)
        with_blobs = request.query.get("blobs", "").lower() in ("1", "true")
        siblings = []
        for path, blob in sorted(commit.files.items()):
            row: dict[str, Any] = {"rfilename": path}
            if with_blobs:
                row.update(size=blob.size, blobId=blob.git_oid)
                if blob.lfs:
                    pointer_size = len(lfs_pointer(blob.sha256, blob.size))
                    row["lfs"] = {"size": blob.size, "sha256": blob.sha256, "pointerSize": pointer_size}
            siblings.append(row)
        info = {
            "_id": repo.repo_id,
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.oid,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "createdAt": iso_time(repo.created_at),
            "lastModified": iso_time(commit.created_at),
            "usedStorage": sum(blob.size for blob in commit.files.values()),
            "siblings": siblings,
        }
        return Reply(200, info)

    def list_tree(self, request: HubRequest, target: Target) -> Reply:
        """GET /api/{type}s/{repo}/tree/{rev}[/{path}]?recursive=...: one page, no Link header."""
        commit = self.commit_at(self.readable(request, target), target.revision)
        recursive = request.query.get("recursive", "").lower() in ("1", "true")
        rows = tree_entries(commit.files, target.path, recursive)
        if target.path and not rows:
            raise hub_error(404, "EntryNotFound", f"{target.path} does not exist on {target.revision}")
        return Reply(200, rows)

    # -- upload: preupload, LFS, commit --------------------------------------------------------------
    def preupload(self, request: HubRequest, target: Target) -> Reply:
        """POST /api/{type}s/{repo}/preupload/main: "lfs" or "regular" per file, and the remote oid."""
        repo = self.writable(request, target)
        head = self.commit_at(repo, target.revision)
        rows = []
        for item in (request.json() or {}).get("files") or []:
            path, size = str(item["path"]), int(item["size"])
            lfs = wants_lfs(path, size, base64.b64decode(str(item.get("sample", ""))))
            existing = head.files.get(path)
            oid = existing.etag if existing is not None and existing.lfs == lfs else None
            mode = "lfs" if lfs else "regular"
            rows.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        return Reply(200, {"files": rows, "commitOid": head.oid})

    def lfs_batch(self, request: HubRequest, target: Target) -> Reply:
        """POST /{repo}.git/info/lfs/objects/batch: basic transfer; upload URLs on this server."""
        repo = self.writable(request, target)
        body = request.json() or {}
        if body.get("operation") != "upload":
            return Reply(400, {"message": "only the upload operation is supported"}, _LFS_JSON)
        verify = f"{request.base_url}/{self.url_path(repo)}.git/info/lfs/objects/verify"
        objects = []
        for item in body.get("objects") or []:
            oid, size = str(item["oid"]), int(item["size"])
            if not SHA256.fullmatch(oid):
                objects.append({"oid": oid, "size": size, "error": {"code": 422, "message": "invalid oid"}})
            elif self.store.blobs.size(oid) == size:
                objects.append({"oid": oid, "size": size})  # already stored: no actions, no upload
            else:
                ticket = secrets.token_urlsafe(16)
                with self._tickets_lock:
                    self._tickets[ticket] = (oid, size)
                upload = {"href": f"{request.base_url}/_lfs/upload/{ticket}", "expires_in": 3600}
                actions = {"upload": upload, "verify": {"href": verify}}
                objects.append({"oid": oid, "size": size, "authenticated": True, "actions": actions})
        return Reply(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}, _LFS_JSON)

    def lfs_upload(self, request: HubRequest, target: Target) -> Reply:
        """PUT /_lfs/upload/{ticket}: the signed-URL stand-in; the body must match the announced oid."""
        with self._tickets_lock:
            expected = self._tickets.get(target.path)
        if expected is None:
            return Reply(403, {"error": "unknown or already used upload URL"})
        sha256, size = self.store.blobs.put_chunks(request.chunks())
        if (sha256, size) != expected:
            return Reply(400, {"error": f"got {sha256} ({size} B), expected {expected[0]} ({expected[1]} B)"})
        with self._tickets_lock:
            self._tickets.pop(target.path, None)
        return Reply(200, None, {"ETag": f'"{sha256[:32]}"'})

    def lfs_verify(self, request: HubRequest, target: Target) -> Reply:
        """POST /{repo}.git/info/lfs/objects/verify: 200 once the object is stored with that size."""
        self.writable(request, target)
        body = request.json() or {}
        if self.store.blobs.size(str(body.get("oid"))) != int(body.get("size", -1)):
            return Reply(404, {"message": "object not found"}, _LFS_JSON)
        return Reply(200, {"success": True}, _LFS_JSON)

    def commit(self, request: HubRequest, target: Target) -> Reply:
        """POST /api/{type}s/{repo}/commit/main: NDJSON header, then file / lfsFile / deleted* lines."""
        repo = self.writable(request, target)
        self.commit_at(repo, target.revision)
        if target.revision != "main" or request.query.get("create_pr"):
            return Reply(400, {"error": "the fake Hub commits to main only (no branches, no pull requests)"})
        header, operations = decode_commit(request.body())
        summary = str(header.get("summary") or "")
        if not summary:
            return Reply(400, {"error": "A commit summary is required"})
        changes = [self._change(repo, item) for item in operations]
        with self.store.lock:
            parent = header.get("parentCommit")
            if parent and not repo.head.oid.startswith(str(parent)):
                return Reply(412, {"error": "A commit has happened since. Please refresh and try again."})
            commit = self.store.commit(repo, summary, str(header.get("description") or ""), changes)
        url = f"{request.base_url}/{self.url_path(repo)}/commit/{commit.oid}"
        body = {"success": True, "commitOid": commit.oid, "commitUrl": url, "hookOutput": ""}
        return Reply(200, {**body, "pullRequestUrl": None})

    def _change(self, repo: Repo, item: dict[str, Any]) -> tuple[str, Blob | None]:
        """One commit operation as (path, new blob or None to delete; a path ending in "/" is a folder)."""
        key, value = item.get("key"), dict(item.get("value") or {})
        path = str(value["path"])
        blobs = self.store.blobs
        if key == "file":
            sha256, size = blobs.put_bytes(decode_content(value))
            return path, blobs.describe(sha256, size, lfs=False)
        if key == "lfsFile":
            oid = str(value["oid"])
            stored = blobs.size(oid) if SHA256.fullmatch(oid) else None
            if stored is None:
                raise Refused(Reply(422, {"error": f"LFS object {oid} for {path} was never uploaded"}))
            return path, blobs.describe(oid, stored, lfs=True)
        if key == "deletedFile":
            if path not in repo.head.files:
                raise hub_error(404, "EntryNotFound", f"{path} does not exist")
            return path, None
        if key == "deletedFolder":
            return path.rstrip("/") + "/", None
        raise ValueError(f"unknown commit operation {key!r}")

    # -- download ----------------------------------------------------------------------------------
    def on_cdn(self, request: HubRequest, target: Target) -> bool:
        """Whether a resolve of `target` is answered with a redirect to the CDN (an LFS file, a CDN on)."""
        if self.cdn is None:
            return False
        try:
            blob = self.commit_at(self.readable(request, target), target.revision).files.get(target.path)
        except Refused:
            return False
        return blob is not None and blob.lfs

    def resolve(self, request: HubRequest, target: Target) -> Reply:
        """HEAD / GET /[{type}s/]{repo}/resolve/{rev}/{path}: a small file served here, with Range; an LFS
        file redirected to the CDN (302, its size and sha256 in X-Linked-*), as the Hub does."""
        commit = self.commit_at(self.readable(request, target), target.revision)
        blob = commit.files.get(target.path)
        if blob is None:
            raise hub_error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit.oid})
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{blob.etag}"', "Accept-Ranges": "bytes"}
        if blob.lfs:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size)})
            if self.cdn is not None:
                return Reply(302, None, {**headers, "Location": self.cdn.location(blob.sha256, target.path)})
        path = self.store.blobs.path(blob.sha256)
        span = parse_range(request.headers.get("range"), blob.size) if request.method == "GET" else None
        if span is None:
            return Reply(200, headers=headers, file=FileBody(path, 0, blob.size))
        headers["Content-Range"] = f"bytes {span[0]}-{span[1] - 1}/{blob.size}"
        return Reply(206, headers=headers, file=FileBody(path, *span))

    def not_routed(self, request: HubRequest, target: Target) -> Reply:
        """Anything the fake does not serve."""
        path = "/".join(request.segments)
        return Reply(404, {"error": f"the fake Hub has no route for {request.method} /{path}"})
