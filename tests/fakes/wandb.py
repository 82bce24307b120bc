"""A fake of the W&B server, good enough for the wandb 0.31 client (its Go core, wandb-core) unmodified.

Point the client at it with `WANDB_BASE_URL=<fake.url>` and a key it knows (`WANDB_API_KEY`). It speaks
what a run's life needs: the GraphQL API (`Viewer`, `RunResumeStatus`, `UpsertBucket`, `CreateRunFiles`,
the server's feature list), the file stream (`/files/<entity>/<project>/<run>/file_stream`: history,
summary, console, system metrics, and the exit code) and the upload URLs CreateRunFiles hands out.

Like W&B it checks the key on every request (HTTP Basic, user `api`): a key it does not know is a 401,
and wandb.init fails. A run may be written only in the user's own entity or a team's (an UpsertBucket
elsewhere is "permission denied"). A run upserted again with the same name is the same run: its
RunResumeStatus gives the history so far, and a resumed client appends at its offset, as W&B's file
stream does. Any other GraphQL field is an error with graphql-js's wording, so a client that needs more
shows it. Runs live in memory; `state()` is what tests read.

Run pages: wandb derives them from its base URL, and for a base URL like this one (not `api.<host>`) the
pages are at the same address: `<fake.url>/<entity>/<project>/runs/<run id>`.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.fakes.graphql_lite import GraphQLError, parse, project
from tests.fakes.serving import Served

DEFAULT_KEY = "f" * 40  # W&B keys are 40 characters
_HISTORY, _SUMMARY, _OUTPUT, _EVENTS = (
    "wandb-history.jsonl",
    "wandb-summary.json",
    "output.log",
    "wandb-events.jsonl",
)


@dataclass
class WandbRun:
    """One run (a "bucket" in W&B's API) as the fake keeps it."""

    entity: str
    project: str
    name: str  # the run id
    display_name: str | None = None
    group: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)  # JSON lines, at the offsets the client gave
    output: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    files: dict[str, int] = field(default_factory=dict)  # uploaded file name -> size
    upserts: int = 0
    resumed: int = 0  # RunResumeStatus queries that found the run (a client continuing it)
    exit_code: int | None = None
    complete: bool = False

    def rows(self) -> list[dict[str, Any]]:
        """The history rows, decoded."""
        return [json.loads(line) for line in self.history]


@dataclass
class WandbArtifact:
    """One artifact version: created, its files and manifest uploaded, then committed."""

    id: str
    entity: str
    project: str
    collection: str
    type: str
    run: str | None
    files: dict[str, int] = field(default_factory=dict)
    state: str = "PENDING"
    digest: str | None = None


class FakeWandb(Served):
    """The fake W&B server. Use as a context manager, or `start()` / `stop()`; `url` is WANDB_BASE_URL."""

    def __init__(
        self, api_key: str = DEFAULT_KEY, user: str = "tester", teams: tuple[str, ...] = (), port: int = 0
    ) -> None:
        self.keys = {api_key}
        self.user = user
        self.teams = teams
        self.port = port
        self.lock = threading.Lock()
        self.runs: dict[tuple[str, str, str], WandbRun] = {}
        self.requests: dict[str, int] = {}
        self.refused: list[str] = []  # why each refused request was refused
        self.artifacts: dict[str, WandbArtifact] = {}

    def new_server(self) -> ThreadingHTTPServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                fake._serve(self)

            do_PUT = do_GET = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        return server

    def state(self) -> dict[str, Any]:
        """Every run (with its decoded history), the request counts per operation, the refusals."""
        with self.lock:
            runs = [{**asdict(r), "rows": r.rows()} for r in self.runs.values()]
            artifacts = [asdict(a) for a in self.artifacts.values()]
            return {
                "runs": runs,
                "artifacts": artifacts,
                "requests": dict(self.requests),
                "refused": list(self.refused),
            }

    # -- HTTP --------------------------------------------------------------------------------------
    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        path = urlsplit(handler.path).path
        segments = [unquote(s) for s in path.split("/")[1:]]
        if segments == ["_fake", "state"] and handler.command == "GET":  # `state()`, for a served fake
            return self._json(handler, 200, self.state())
        if segments[:3] == ["sdk", "otel", "v1"]:  # wandb-core's own telemetry
            return self._reply(handler, 200, b"", "application/x-protobuf")
        if segments[:1] == ["_upload"] and handler.command == "PUT":  # the URLs CreateRunFiles gave
            return self._upload(handler, segments[1:], body)
        if not self._authorized(handler.headers.get("Authorization")):
            self._count("unauthorized")
            with self.lock:
                self.refused.append(f"{handler.command} {path}: unknown API key")
            return self._json(handler, 401, {"errors": [{"message": "user is not logged in"}]})
        if path == "/graphql" and handler.command == "POST":
            return self._json(handler, 200, self._graphql(json.loads(body or b"{}"), handler))
        if len(segments) == 5 and segments[0] == "files" and segments[4] == "file_stream":
            self._count("file_stream")
            answer = self._file_stream(segments[1], segments[2], segments[3], body)
            return self._json(handler, 404 if "error" in answer else 200, answer)
        self._count("other")
        return self._json(handler, 404, {"error": f"no route for {handler.command} {path}"})

    def _authorized(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, key = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return user == "api" and key in self.keys

    def _reply(self, handler: BaseHTTPRequestHandler, status: int, data: bytes, kind: str) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _json(self, handler: BaseHTTPRequestHandler, status: int, data: Any) -> None:
        self._reply(handler, status, json.dumps(data).encode(), "application/json")

    def _count(self, op: str) -> None:
        with self.lock:
            self.requests[op] = self.requests.get(op, 0) + 1

    # -- GraphQL -----------------------------------------------------------------------------------
    def _graphql(self, request: dict[str, Any], handler: BaseHTTPRequestHandler) -> dict[str, Any]:
        variables = request.get("variables") or {}
        try:
            op = parse(str(request.get("query", "")))
            self._count(op.fields[0].name if op.fields else "empty")
            root = self._mutations(handler) if op.kind == "mutation" else self._queries()
            with self.lock:
                return {"data": project(root, op.fields, variables, op.kind.capitalize())}
        except GraphQLError as exc:
            with self.lock:
                self.refused.append(f"{exc} in {' '.join(str(request.get('query', '')).split())[:2000]}")
            return {"data": None, "errors": [{"message": str(exc)}]}

    def _queries(self) -> dict[str, Any]:
        viewer = {
            "id": _gid("User", self.user),
            "entity": self.user,
            "username": self.user,
            "email": f"{self.user}@example.com",
            "flags": "{}",
            "teams": {"edges": [{"node": {"name": t}} for t in self.teams]},
        }
        return {
            "viewer": viewer,
            "serverInfo": {"features": []},
            "model": lambda args: self._project(args.get("entityName"), args.get("name")),
            "project": lambda args: self._project(args.get("entityName"), args.get("name")),
            "entity": lambda args: {"organization": None} if args.get("name") in self._entities() else None,
        }

    def _mutations(self, handler: BaseHTTPRequestHandler) -> dict[str, Any]:
        base = f"http://{handler.headers.get('Host', '127.0.0.1')}"
        return {
            "upsertBucket": lambda args: self._upsert(args["input"]),
            "createRunFiles": lambda args: self._create_run_files(args["input"], base),
            "createArtifact": lambda args: self._create_artifact(args["input"]),
            "createArtifactManifest": lambda args: self._create_manifest(args["input"], base),
            "createArtifactFiles": lambda args: self._create_artifact_files(args["input"], base),
            "commitArtifact": lambda args: self._commit_artifact(args["input"]),
        }

    def _entities(self) -> set[str]:
        return {self.user, *self.teams}

    def _project(self, entity: str | None, name: str | None) -> dict[str, Any] | None:
        entity = entity or self.user
        if not any(key[:2] == (entity, name) for key in self.runs):
            return None
        return {
            "id": _gid("Project", f"{entity}/{name}"),
            "name": name,
            "entity": {"id": _gid("Entity", entity), "name": entity},
            "bucket": lambda args: self._resume_status(entity, str(name), args["name"]),
            "artifact": lambda args: self._artifact_named(entity, str(name), args["name"]),
        }

    def _resume_status(self, entity: str, project_name: str, name: str) -> dict[str, Any] | None:
        run = self.runs.get((entity, project_name, name))
        if run is None:
            return None
        run.resumed += 1
        return {
            **self._bucket(run),
            "summaryMetrics": json.dumps(run.summary),
            "logLineCount": len(run.output),
            "eventsLineCount": len(run.events),
            "historyTail": json.dumps(run.history[-1:]),
            "eventsTail": json.dumps(run.events[-1:]),
            "tags": [],
            "notes": None,
            "wandbConfig": lambda args: json.dumps(_wandb_keys(run.config, args.get("keys") or [])),
        }

    def _bucket(self, run: WandbRun) -> dict[str, Any]:
        return {
            "id": _gid("Run", f"{run.entity}/{run.project}/{run.name}"),
            "name": run.name,
            "displayName": run.display_name,
            "description": None,
            "config": json.dumps(run.config),
            "sweepName": None,
            "historyLineCount": len(run.history),
            "project": {
                "id": _gid("Project", f"{run.entity}/{run.project}"),
                "name": run.project,
                "entity": {"id": _gid("Entity", run.entity), "name": run.entity},
            },
        }

    def _upsert(self, given: dict[str, Any]) -> dict[str, Any]:
        entity = given.get("entityName") or self.user
        if entity not in self._entities():
            raise GraphQLError(f"permission denied: {self.user} may not write to the entity {entity}")
        project_name, name = given.get("modelName") or "uncategorized", given.get("name")
        if not name:
            raise GraphQLError("upsertBucket: a run needs a name")
        key = (entity, project_name, name)
        inserted = key not in self.runs
        run = self.runs.setdefault(key, WandbRun(entity, project_name, name))
        run.upserts += 1
        if given.get("displayName"):
            run.display_name = given["displayName"]
        if given.get("groupName"):
            run.group = given["groupName"]
        if given.get("config"):
            run.config.update(json.loads(given["config"]))
        if given.get("summaryMetrics"):
            run.summary.update(json.loads(given["summaryMetrics"]))
        return {"bucket": self._bucket(run), "inserted": inserted}

    def _create_run_files(self, given: dict[str, Any], base: str) -> dict[str, Any]:
        key = (given["entityName"], given["projectName"], given["runName"])
        if key not in self.runs:
            raise GraphQLError(f"run {'/'.join(key)} not found")
        prefix = "/".join(["_upload", *key])
        files = [{"name": n, "uploadUrl": f"{base}/{prefix}/{n}"} for n in given["files"]]
        return {"runID": _gid("Run", "/".join(key)), "uploadHeaders": [], "files": files}

    def _upload(self, handler: BaseHTTPRequestHandler, parts: list[str], body: bytes) -> None:
        self._count("upload")
        with self.lock:
            if parts[:1] == ["_artifacts"]:
                artifact = self.artifacts.get(parts[1]) if len(parts) > 2 else None
                if artifact is not None:
                    artifact.files["/".join(parts[2:])] = len(body)
                found = artifact is not None
            else:
                run = self.runs.get((parts[0], parts[1], parts[2])) if len(parts) > 3 else None
                if run is not None:
                    run.files["/".join(parts[3:])] = len(body)
                found = run is not None
        self._reply(handler, 200 if found else 404, b"", "text/plain")

    # -- artifacts (W&B saves each logged wandb.Table as one: type run_table) --------------------------
    def _artifact_named(self, entity: str, project_name: str, name: str) -> dict[str, Any] | None:
        collection, _, alias = name.partition(":")
        found = [
            a
            for a in self.artifacts.values()
            if (a.entity, a.project, a.collection) == (entity, project_name, collection)
            and a.state == "COMMITTED"
        ]
        if not found or alias not in ("", "latest"):
            return None
        return {"id": found[-1].id, "state": found[-1].state, "artifactType": {"name": found[-1].type}}

    def _create_artifact(self, given: dict[str, Any]) -> dict[str, Any]:
        entity = given.get("entityName") or self.user
        if entity not in self._entities():
            raise GraphQLError(f"permission denied: {self.user} may not write to the entity {entity}")
        aid = _gid("Artifact", str(len(self.artifacts)))
        self.artifacts[aid] = WandbArtifact(
            aid,
            entity,
            given["projectName"],
            given["artifactCollectionName"],
            given["artifactTypeName"],
            given.get("runName"),
        )
        return {"artifact": {"id": aid, "state": "PENDING", "artifactSequence": {"latestArtifact": None}}}

    def _artifact(self, aid: str) -> WandbArtifact:
        if aid not in self.artifacts:
            raise GraphQLError(f"artifact {aid} not found")
        return self.artifacts[aid]

    def _create_manifest(self, given: dict[str, Any], base: str) -> dict[str, Any]:
        aid = self._artifact(given["artifactID"]).id
        url = f"{base}/_upload/_artifacts/{aid}/{given['name']}"
        file = {"id": _gid("File", f"{aid}/{given['name']}"), "uploadUrl": url, "uploadHeaders": []}
        return {"artifactManifest": {"id": _gid("Manifest", aid), "file": file}}

    def _create_artifact_files(self, given: dict[str, Any], base: str) -> dict[str, Any]:
        edges = []
        for item in given.get("artifactFiles") or []:
            path = f"_artifacts/{self._artifact(item['artifactID']).id}/{item['name']}"
            node = {
                "storagePath": path,
                "uploadUrl": f"{base}/_upload/{path}",
                "uploadHeaders": [],
                "uploadMultipartUrls": None,
                "artifact": {"id": item["artifactID"]},
            }
            edges.append({"node": node})
        return {"files": {"edges": edges}}

    def _commit_artifact(self, given: dict[str, Any]) -> dict[str, Any]:
        artifact = self._artifact(given["artifactID"])
        if "wandb_manifest.json" not in artifact.files:
            raise GraphQLError(f"artifact {artifact.id} has no manifest to commit")
        artifact.state = "COMMITTED"
        artifact.digest = _gid("Digest", artifact.id)
        return {"artifact": {"id": artifact.id, "digest": artifact.digest}}

    # -- the file stream ---------------------------------------------------------------------------
    def _file_stream(self, entity: str, project_name: str, name: str, body: bytes) -> dict[str, Any]:
        data = json.loads(body or b"{}")
        with self.lock:
            run = self.runs.get((entity, project_name, name))
            if run is None:
                return {"error": f"run {entity}/{project_name}/{name} not found"}
            for file_name, chunk in (data.get("files") or {}).items():
                content, offset = list(chunk.get("content") or []), int(chunk.get("offset") or 0)
                if file_name == _SUMMARY and content:
                    run.summary = json.loads(content[-1])
                elif file_name in (_HISTORY, _OUTPUT, _EVENTS):
                    lines = {_HISTORY: run.history, _OUTPUT: run.output, _EVENTS: run.events}[file_name]
                    lines.extend([""] * (offset - len(lines)))  # a gap W&B would keep empty
                    lines[offset : offset + len(content)] = content
            if data.get("complete"):
                run.complete = True
                run.exit_code = data.get("exitcode")
        return {"exitcode": None, "limits": {}}


def _wandb_keys(config: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The keys of the run's own `_wandb` config entry (`t`: telemetry, there once a client started it)."""
    own = (config.get("_wandb") or {}).get("value") or {}
    return {k: own[k] for k in keys if k in own}


def _gid(kind: str, name: str) -> str:
    """An opaque id the way W&B's look (base64 of "<Type>:<name>")."""
    return base64.b64encode(f"{kind}:{name}".encode()).decode()
