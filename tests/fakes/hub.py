"""A fake of the Hugging Face Hub's HTTP API, good enough for huggingface_hub 2.4 unmodified.

Point the client at it with `HF_ENDPOINT=<hub.url>` (read when huggingface_hub is imported) or with
`endpoint=hub.url`, and set `HF_HUB_DISABLE_XET=1`: the fake speaks only the plain HTTP and git LFS
protocols and never advertises Xet. It serves repo creation, `upload_folder` (preupload, the LFS batch
API with its own upload and verify URLs, the NDJSON commit), repo info and trees, and
`/{repo}/resolve/{revision}/{path}` downloads with Range: a small file from the Hub itself, an LFS file
through a 302 to the fake's CDN (tests/fakes/hub_cdn.py: another origin, signed URLs that refuse a
request carrying Authorization), as huggingface.co does (`cdn=False`: everything served directly).
Mutations need `Authorization: Bearer <token>`; private repos look missing without it, as on the Hub.
File downloads can be capped per connection (`throttle_bps`) and, all connections together, by a shared
link (`link_bps`: one token bucket across every download from the Hub and its CDN, as a node's network
link caps them), and faults can be scripted per operation.

Operations (request counts, fault rules): whoami, create_repo, delete_repo, validate_yaml, repo_info,
list_tree, preupload, lfs_batch, lfs_upload, lfs_verify, commit, file_head (HEAD resolve, or the CDN's),
redirect (GET resolve of an LFS file: the 302), download (a GET that sends bytes: the Hub's or the CDN's),
other.
Control endpoints: GET /_fake/state, POST /_fake/faults (a list of rules), POST /_fake/throttle {"bps"},
POST /_fake/link {"bps"} (null: no cap).
Repos live in memory; file contents live on disk under `home`.

In a test: `with FakeHub(home=tmp_path, token=TOKEN) as hub: ... hub.url ...`; seed a repo without HTTP
with `hub.put_files(repo_id, {path: bytes_or_Path})`.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from tests.fakes.faults import FaultRule
from tests.fakes.hub_cdn import HubCdn
from tests.fakes.hub_routes import HubRoutes, Refused, Target
from tests.fakes.hub_store import REPO_TYPES, Blob, RepoStore, wants_lfs
from tests.fakes.hub_tokens import Role, TokenScope
from tests.fakes.hub_wire import HubRequest, HubServer, Link, Reply
from tests.fakes.serving import Served

DEFAULT_TOKEN = "hf-test-token"
FAULT_KINDS = frozenset({"500", "429", "timeout", "disconnect"})
_PLURALS = {f"{t}s": t for t in REPO_TYPES}
_DOWNLOAD_LOG = 1000


@dataclass
class HubFault(FaultRule):
    """The Hub's scripted misbehaviours.

    Kinds: "500" and "429" answer at once (429 with Retry-After); "timeout" waits `delay` seconds, then
    answers normally; "disconnect" drops the connection: a download after `after_bytes` body bytes
    (default: half the body), anything else before answering.
    """

    delay: float = 0.0
    after_bytes: int | None = None

    KINDS: ClassVar[frozenset[str]] = FAULT_KINDS


@dataclass
class _Download:
    """One resolve GET, as /_fake/state lists it."""

    path: str
    range: str | None
    status: int
    bytes: int = 0


class FakeHub(Served, HubRoutes):
    """The fake Hub. Use as a context manager, or `start()` / `stop()`.

    `home` keeps the blobs (a temporary directory, removed on stop, when None); `token` is the one valid
    access token; `throttle_bps` caps each file download's bytes per second (None: no cap); `link_bps` caps
    the bytes per second of all file downloads together, whatever the number of connections (None: no cap).
    """

    def __init__(
        self,
        home: Path | None = None,
        token: str = DEFAULT_TOKEN,
        throttle_bps: float | None = None,
        port: int = 0,
        link_bps: float | None = None,
        user: str = "tester",
        cdn: bool = True,
    ) -> None:
        self._own_home = home is None
        self.home = Path(tempfile.mkdtemp(prefix="fake-hub-")) if home is None else home
        super().__init__(RepoStore(self.home), token, user)
        self.cdn = HubCdn(self.store, self.serve) if cdn else None
        self.throttle_bps = throttle_bps
        self.link: Link | None = None
        self.set_link(link_bps)
        self.port = port
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.faults: list[HubFault] = []
        self.downloads: list[_Download] = []
        self.bytes_served = 0

    # -- lifecycle (start, url (HF_ENDPOINT), stop, `with`: tests.fakes.serving) -------------------
    def new_server(self) -> HubServer:
        return HubServer(self, self.port)

    def start(self) -> Self:
        """Serve the CDN, then the Hub."""
        if self.cdn is not None:
            self.cdn.start()
        return super().start()

    def after_stop(self) -> None:
        """Stop the CDN; remove a temporary home."""
        if self.cdn is not None:
            self.cdn.stop()
        if self._own_home:
            shutil.rmtree(self.home, ignore_errors=True)

    # -- knobs for in-process tests (also behind /_fake/...) ---------------------------------------
    def add_token(self, token: str, role: Role = "write", namespaces: Iterable[str] | None = None) -> None:
        """Another valid token: a read token, a write token for the user's and its orgs' namespaces, or,
        with `namespaces`, a fine-grained one that may write there only."""
        if namespaces is None:
            self.tokens[token] = TokenScope(
                role, frozenset({self.user, *self.orgs}) if role == "write" else frozenset()
            )
        else:
            self.tokens[token] = TokenScope(role, frozenset(namespaces), fine_grained=True)

    def put_files(
        self,
        repo_id: str,
        files: Mapping[str, bytes | Path],
        private: bool = False,
        repo_type: str = "model",
        message: str = "Upload files",
    ) -> str:
        """Commit files straight into a repo, creating it (with `private`) if missing; returns the sha.

        A `Path` is copied into the blob store in chunks, so seeding a large model costs one disk copy.
        """
        if repo_type not in REPO_TYPES:
            raise ValueError(f"unknown repo type {repo_type!r}; valid: {list(REPO_TYPES)}")
        if repo_id.count("/") != 1:
            raise ValueError(f"repo id {repo_id!r} must be 'namespace/name'")
        blobs = self.store.blobs
        repo, _ = self.store.create(repo_type, repo_id, private)
        changes: dict[str, Blob] = {}
        for path, content in files.items():
            sha256, size = blobs.put_file(content) if isinstance(content, Path) else blobs.put_bytes(content)
            changes[path] = blobs.describe(sha256, size, wants_lfs(path, size, blobs.sample(sha256)))
        return self.store.commit(repo, message, "", changes.items()).oid

    def set_link(self, bps: float | None) -> None:
        """Cap all file downloads together at `bps` bytes per second from now on (None: no cap); downloads
        under way keep the budget they started with."""
        self.link = None if bps is None else Link(float(bps))

    def add_faults(self, rules: list[dict[str, Any]]) -> None:
        """Queue fault rules; they are consumed in order."""
        parsed = [HubFault.from_json(rule) for rule in rules]
        with self.lock:
            self.faults.extend(parsed)

    def state(self) -> dict[str, Any]:
        """Repos (head, commits, files with sizes and sha256), request counts, and recent downloads."""
        with self.store.lock:
            repos = [repo.public() for repo in self.store.repos.values()]
        with self.lock:
            return {
                "repos": repos,
                "requests": dict(self.requests),
                "downloads": [
                    {"path": d.path, "range": d.range, "status": d.status, "bytes": d.bytes}
                    for d in self.downloads
                ],
                "bytes_served": self.bytes_served,
                "throttle_bps": self.throttle_bps,
                "link_bps": self.link.rate_bps if self.link is not None else None,
            }

    # -- dispatch ----------------------------------------------------------------------------------
    def take_fault(self, op: str) -> HubFault | None:
        """The first queued rule for `op` (or "*"), consumed once."""
        with self.lock:
            for fault in self.faults:
                if fault.op in (op, "*") and fault.times > 0:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    def dispatch(self, request: HubRequest) -> Reply:
        """Control endpoints first, then the token check, fault injection and the route's handler. A GET of
        an LFS file is a redirect to the CDN (op "redirect"), whose GET is then the "download"."""
        if request.segments[:1] == ["_fake"]:
            return self._control(request)
        op, handler, target = self.route(request)
        if op == "download" and self.on_cdn(request, target):
            op = "redirect"
        if op != "lfs_upload" and self.bearer(request) not in ("", *self.tokens):
            self._count(op)
            message = "Invalid credentials in Authorization header"
            return Reply(401, {"error": message}, {"X-Error-Message": message})
        return self.serve(op, request, target.path, lambda: handler(request, target))

    def serve(self, op: str, request: HubRequest, path: str, answer: Callable[[], Reply]) -> Reply:
        """Count `op`, apply its scripted fault, answer (`answer()`), and log a download of `path`: the Hub's
        requests and its CDN's alike."""
        self._count(op)
        fault = self.take_fault(op)
        if fault is not None and fault.kind == "429":
            return Reply(429, {"error": "Too many requests"}, {"Retry-After": f"{fault.retry_after:g}"})
        if fault is not None and fault.kind == "500":
            return Reply(500, {"error": "Internal server error"})
        if fault is not None and fault.kind == "timeout":
            time.sleep(fault.delay)
        try:
            reply = answer()
        except Refused as refused:
            reply = refused.reply
        except (ValueError, KeyError, TypeError) as exc:  # a malformed body: what the Hub calls a bad request
            reply = Reply(400, {"error": f"Bad request: {exc!r}"})
        if fault is not None and fault.kind == "disconnect":
            if reply.file is None:
                return Reply.hang_up()
            length = reply.file.end - reply.file.start
            reply.disconnect_after = length // 2 if fault.after_bytes is None else fault.after_bytes
        if op == "download":
            self._log_download(reply, path, request.headers.get("range"))
        return reply

    def _count(self, op: str) -> None:
        with self.lock:
            self.requests[op] = self.requests.get(op, 0) + 1

    def route(self, request: HubRequest) -> tuple[str, Callable[[HubRequest, Target], Reply], Target]:
        """(operation name, handler, parsed target) for a request."""
        s, method = request.segments, request.method
        if s[:1] == ["api"]:
            if s == ["api", "whoami-v2"] and method == "GET":
                return "whoami", self.whoami, Target()
            if s == ["api", "repos", "create"] and method == "POST":
                return "create_repo", self.create_repo, Target()
            if s == ["api", "repos", "delete"] and method == "DELETE":
                return "delete_repo", self.delete_repo, Target()
            if s == ["api", "validate-yaml"] and method == "POST":
                return "validate_yaml", self.validate_yaml, Target()
            if len(s) >= 4 and s[1] in _PLURALS:
                return self._route_api(method, Target(_PLURALS[s[1]], f"{s[2]}/{s[3]}"), s[4:])
        elif s[:2] == ["_lfs", "upload"] and len(s) == 3 and method == "PUT":
            return "lfs_upload", self.lfs_upload, Target(path=s[2])
        else:
            repo_type = "model"
            if s[:1] in (["datasets"], ["spaces"]):
                repo_type, s = s[0][:-1], s[1:]
            if len(s) == 6 and s[1].endswith(".git") and s[2:5] == ["info", "lfs", "objects"]:
                target = Target(repo_type, f"{s[0]}/{s[1][: -len('.git')]}")
                if s[5] == "batch" and method == "POST":
                    return "lfs_batch", self.lfs_batch, target
                if s[5] == "verify" and method == "POST":
                    return "lfs_verify", self.lfs_verify, target
            if len(s) >= 5 and s[2] == "resolve" and method in ("GET", "HEAD"):
                target = Target(repo_type, f"{s[0]}/{s[1]}", s[3], "/".join(s[4:]))
                return ("download" if method == "GET" else "file_head"), self.resolve, target
        return "other", self.not_routed, Target()

    def _route_api(
        self, method: str, target: Target, rest: list[str]
    ) -> tuple[str, Callable[[HubRequest, Target], Reply], Target]:
        """Routes under /api/{type}s/{namespace}/{name}/..."""
        if method == "GET" and (not rest or (len(rest) == 2 and rest[0] == "revision")):
            target.revision = rest[1] if rest else "main"
            return "repo_info", self.repo_info, target
        if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
            target.revision, target.path = rest[1], "/".join(rest[2:]).strip("/")
            return "list_tree", self.list_tree, target
        if method == "POST" and len(rest) == 2 and rest[0] in ("preupload", "commit"):
            target.revision = rest[1]
            return rest[0], (self.preupload if rest[0] == "preupload" else self.commit), target
        return "other", self.not_routed, target

    def _log_download(self, reply: Reply, path: str, range_header: str | None) -> None:
        entry = _Download(path, range_header, reply.status)
        with self.lock:
            self.downloads = [*self.downloads[-(_DOWNLOAD_LOG - 1) :], entry]

        def on_sent(piece: int) -> None:
            with self.lock:
                entry.bytes += piece
                self.bytes_served += piece

        reply.on_sent = on_sent
        reply.rate_bps = self.throttle_bps
        reply.link = self.link

    def _control(self, request: HubRequest) -> Reply:
        path, method = "/".join(request.segments), request.method
        if path == "_fake/state" and method == "GET":
            return Reply(200, self.state())
        try:
            if path == "_fake/faults" and method == "POST":
                self.add_faults(list(request.json() or []))
                return Reply(200, {"queued": len(self.faults)})
            if path == "_fake/throttle" and method == "POST":
                bps = (request.json() or {}).get("bps")
                self.throttle_bps = None if bps is None else float(bps)
                return Reply(200, {"throttle_bps": self.throttle_bps})
            if path == "_fake/link" and method == "POST":
                self.set_link((request.json() or {}).get("bps"))
                return Reply(200, {"link_bps": self.link.rate_bps if self.link is not None else None})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return Reply(400, {"error": str(exc)})
        return Reply(404, {"error": "no such control endpoint"})
