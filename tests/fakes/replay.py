"""Light nodes for the fake clouds (`nodes="replay"`): no Ray, no torch, yet every stage of a run completes.

Each node is a small HTTP server on its published port, as a stub node is (tests.fakes.nodes.StubNodes):
the Ray Jobs API subset the fleet uses (`GET /api/version`, `POST /api/jobs/`, `GET /api/jobs/<id>` and
`.../logs`, `POST /api/jobs/<id>/stop`, the package check, the State API's node list), each call with the
node's token (`Authorization: Bearer <token>`; 401 without). Submissions are idempotent by id, as Ray's
are (a second one is refused with Ray's "already exists"). A job is known by its entrypoint:

- `python -m trainer check ...`: SUCCEEDED after `JOB_S["check"]` with the CHECKED line of a stub node;
- `python -m trainer fetch`: SUCCEEDED after `JOB_S["fetch"]` with the recorded FETCHED line;
- `python -m trainer train`: RUNNING for `train_s` seconds while its log grows line by line with the
  progress stream of one real run of the tiny job (tests/data/replay/train-progress.jsonl: STARTED, STEPs,
  EVALs, CHECKPOINTs, FINISHED, DONE), its timings scaled to `train_s`, then SUCCEEDED (`exit_s` later);
- `python -m trainer pack`: the CHUNK and PACKED lines of a small output directory, packed by the
  project's own trainer/pack.py, so the fleet's `pack.unpack` accepts them;
- `python -m trainer push`: a PUSHED line naming the job's hub_model_id;
- `sh -c ...` (a job's entry script): SUCCEEDED at once, exit code 0; anything else FAILED.

The recorded lines name the recording's directories as `{work_dir}`, `{output_dir}`, `{cache_dir}` and
`{run_id}`; a node fills in the run's own, from the TrainJob in the job's environment (FLEET_TRAIN_JOB).
Each line a node replays from the train and fetch jobs carries `replay_emitted_at`: the wall time at which
it appeared in the job's log (a progress record keeps undeclared keys, so the event in the ledger carries it
too), and a node with a `journal` file appends one JSON line per job it runs (node, submission id, kind,
start, end): what a bench measures node-to-ledger and stage-transition latency with.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import secrets
import shlex
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes.nodes import STUB_CHECK, STUB_RAY_VERSION, Boot, StubNodes, _StubHandler, _StubServer
from trainer import pack
from trainer.config import ENV_PREFIX
from trainer.progress import ENV_VAR, MARKER

RECORDING = Path(__file__).resolve().parents[1] / "data" / "replay"
TRAIN_S = 4.0  # how long a replayed train job runs, by default
JOB_S = {"check": 0.5, "fetch": 1.0, "pack": 0.3, "push": 0.3, "entry": 0.1}  # the other jobs' durations
END_AFTER_LAST_S = 0.2  # a train job ends this long after its last line (the trainer exits): Replayer.exit_s
EMITTED = "replay_emitted_at"
JOURNAL = "replay-jobs.jsonl"
POLL_S = 0.5  # each node server's shutdown poll (its stop is not waited for: see ReplayNodes.stop)
OUTPUT_FILES = {  # the small output directory every pack job brings back
    "adapter_config.json": json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16}),
    "adapter_model.safetensors": "replayed adapter weights\n" * 64,
    "metrics.json": json.dumps({"eval_loss": 3.9, "train_loss": 4.0}),
    "README.md": "---\nlibrary_name: peft\n---\n# replayed\n",
}


@dataclass(frozen=True)
class Recording:
    """The recorded progress lines: the train job's (seconds since its first line, record) in order, and
    the fetch job's FETCHED record."""

    train: list[tuple[float, dict[str, Any]]]
    fetched: dict[str, Any]

    @classmethod
    def load(cls, folder: Path = RECORDING) -> Recording:
        text = (folder / "train-progress.jsonl").read_text()
        rows = [json.loads(line) for line in text.splitlines() if line]
        first = rows[0]["t"]
        train = [(float(row["t"]) - first, row["record"]) for row in rows]
        fetched = json.loads((folder / "fetch-progress.jsonl").read_text().splitlines()[0])["record"]
        return cls(train, fetched)

    def train_lines(self, train_s: float) -> list[tuple[float, dict[str, Any]]]:
        """The train job's lines with their offsets scaled so the last comes `train_s` after the start."""
        span = self.train[-1][0] or 1.0
        last = max(0.0, train_s - END_AFTER_LAST_S)
        return [(t / span * last, record) for t, record in self.train]


def packed_lines(files: dict[str, str] = OUTPUT_FILES) -> list[str]:
    """The log of `python -m trainer pack` over a directory holding `files` (trainer.pack's own lines)."""
    with tempfile.TemporaryDirectory(prefix="replay-pack-") as folder:
        for name, text in files.items():
            (Path(folder) / name).write_text(text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):  # pack.emit writes to sys.stdout (before any server runs)
            pack.pack(Path(folder))
    return out.getvalue().splitlines()


@dataclass
class Job:
    """One replayed Ray job: its lines (wall time they appear, text), when it ends and how."""

    sid: str
    entrypoint: str
    kind: str
    started: float
    ends: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    final: str = "SUCCEEDED"
    message: str = "Job finished successfully."
    stopped_at: float | None = None

    def status(self, now: float) -> str:
        if self.stopped_at is not None:
            return "STOPPED"
        return self.final if now >= self.ends else "RUNNING"

    def logs(self, now: float) -> str:
        """What the job printed by `now` (nothing after it was stopped)."""
        until = now if self.stopped_at is None else min(now, self.stopped_at)
        return "".join(text + "\n" for at, text in self.lines if at <= until)

    def details(self, now: float) -> dict[str, Any]:
        """The job as Ray's `GET /api/jobs/<id>` answers (JobDetails)."""
        status = self.status(now)
        ended = status != "RUNNING"
        end = self.stopped_at if self.stopped_at is not None else self.ends
        return {
            "type": "SUBMISSION",
            "job_id": None,
            "submission_id": self.sid,
            "entrypoint": self.entrypoint,
            "status": status,
            "message": self.message if ended else "Job is currently running.",
            "start_time": int(self.started * 1000),
            "end_time": int(end * 1000) if ended else None,
            "metadata": {},
            "runtime_env": {},
            "driver_exit_code": (0 if status == "SUCCEEDED" else 1) if ended else None,
        }


def kind_of(entrypoint: str) -> str | None:
    """Which job an entrypoint is: check, fetch, train, pack, push, entry; None for anything else."""
    try:
        words = shlex.split(entrypoint)
    except ValueError:
        return None
    if words[:3] == ["python", "-m", "trainer"] and len(words) > 3 and words[3] in JOB_S.keys() | {"train"}:
        return words[3]
    return "entry" if words[:2] == ["sh", "-c"] else None


class Replayer:
    """What every node of one backend replays, built once: the recording, the pack lines, the timings."""

    def __init__(self, train_s: float = TRAIN_S, journal: Path | None = None) -> None:
        self.train_s = train_s
        self.exit_s = END_AFTER_LAST_S  # from a train job's last line (DONE) to its end
        self.stopped: list[str] = []  # the jobs stopped while they ran (submission ids), in order
        self.recording = Recording.load()
        self.packed = packed_lines()
        self.journal = journal
        self._journal_lock = threading.Lock()

    def job(self, node: str, sid: str, entrypoint: str, env: dict[str, str]) -> Job:
        """The job a node runs for this submission, its lines timed from now."""
        now = time.time()
        kind = kind_of(entrypoint)
        if kind is None:
            why = "a replay node runs only the trainer's jobs and entry scripts"
            return Job(sid, entrypoint, "other", now, now, final="FAILED", message=why)
        if kind == "train":
            timed = self.recording.train_lines(self.train_s)
            lines = [(now + t, self._stamped(record, env, now + t)) for t, record in timed]
            job = Job(sid, entrypoint, kind, now, lines[-1][0] + self.exit_s, lines)
        else:
            ends = now + JOB_S[kind]
            lines = [(ends, text) for text in self._lines(kind, env, ends)]
            job = Job(sid, entrypoint, kind, now, ends, lines)
        self._note(node, job)
        return job

    def _lines(self, kind: str, env: dict[str, str], at: float) -> list[str]:
        if kind == "check":
            return [MARKER + json.dumps(STUB_CHECK)]
        if kind == "fetch":
            return [self._stamped(self.recording.fetched, env, at)]
        if kind == "pack":
            return self.packed
        if kind == "push":
            repo = str(_train_job(env).get("config", {}).get("hub_model_id") or "replay/adapter")
            record = {"kind": "pushed", "repo_id": repo, "commit": "0" * 40, "url": f"https://hub/{repo}"}
            return [MARKER + json.dumps(record)]
        return []  # an entry script prints nothing

    def _stamped(self, record: dict[str, Any], env: dict[str, str], at: float) -> str:
        """The record as the run's own progress line (its directories filled in), stamped with `at`."""
        job = _train_job(env)
        text = json.dumps(record)
        for key in ("work_dir", "output_dir", "cache_dir", "run_id"):
            text = text.replace("{" + key + "}", str(job.get(key, key)))
        return MARKER + json.dumps({**json.loads(text), EMITTED: round(at, 4)}, separators=(",", ":"))

    def _note(self, node: str, job: Job) -> None:
        if self.journal is None:
            return
        row = {"node": node, "sid": job.sid, "kind": job.kind, "started": job.started, "ends": job.ends}
        with self._journal_lock, self.journal.open("a") as out:
            out.write(json.dumps(row) + "\n")


def _train_job(env: dict[str, str]) -> dict[str, Any]:
    """The TrainJob a node's job got in its environment (trainer.config.TrainJob.to_env: JSON, in base64
    behind a prefix), as plain data; empty when it has none."""
    text = env.get(ENV_VAR) or "{}"
    try:
        if text.startswith(ENV_PREFIX):
            text = base64.b64decode(text[len(ENV_PREFIX) :]).decode()
        job = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return {}
    return job if isinstance(job, dict) else {}


class _ReplayHandler(_StubHandler):
    """The stub node's version and package calls, and replayed jobs (see the module docstring)."""

    server: _ReplayServer
    disable_nagle_algorithm = True  # headers and body are two writes: without it, ~40 ms a kept-alive call

    def do_GET(self) -> None:
        if not self._authorized():
            return
        path = self.path.split("?")[0].rstrip("/")
        parts = path.split("/")
        now = time.time()
        if path == "/api/version":
            self._reply(200, {"version": "4", "ray_version": STUB_RAY_VERSION, "ray_commit": "replay"})
        elif path.startswith("/api/packages/"):
            self._reply(200, {})  # "already uploaded": nothing is ever run from it
        elif path == "/api/v0/nodes":
            head = {"node_id": self.server.name, "is_head_node": True, "state": "ALIVE"}
            node = {**head, "node_ip": "127.0.0.1", "resources_total": {"CPU": 1.0}}
            self._reply(200, {"data": {"result": {"result": [node]}}})
        elif len(parts) >= 4 and parts[:3] == ["", "api", "jobs"] and (job := self.server.job(parts[3])):
            if parts[4:] == ["logs"]:
                self._reply(200, {"logs": job.logs(now)})
            else:
                self._reply(200, job.details(now))
        elif len(parts) >= 4 and parts[:3] == ["", "api", "jobs"]:
            self._reply(404, {"error": f"Job {parts[3]} does not exist"})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        path = self.path.rstrip("/")
        parts = path.split("/")
        if path == "/api/jobs":
            sid = str(self.payload.get("submission_id") or secrets.token_hex(8))
            env = dict((self.payload.get("runtime_env") or {}).get("env_vars") or {})
            if not self.server.submit(sid, str(self.payload.get("entrypoint", "")), env):
                self._reply(400, {"error": f"Job with submission_id {sid} already exists."})
                return
            self._reply(200, {"submission_id": sid, "job_id": None})
        elif len(parts) == 5 and parts[:3] == ["", "api", "jobs"] and parts[4] == "stop":
            self._reply(200, {"stopped": self.server.stop_job(parts[3])})
        else:
            self._reply(404, {"error": "not found"})


class _ReplayServer(_StubServer):
    def __init__(self, name: str, token: str, replayer: Replayer) -> None:
        self.name, self.replayer = name, replayer
        self.replays: dict[str, Job] = {}
        self.lock = threading.Lock()
        super().__init__(token)
        self.RequestHandlerClass = _ReplayHandler

    def job(self, sid: str) -> Job | None:
        with self.lock:
            return self.replays.get(sid)

    def submit(self, sid: str, entrypoint: str, env: dict[str, str]) -> bool:
        """Start the job; False when the node already has one with this id."""
        with self.lock:
            if sid in self.replays:
                return False
            self.replays[sid] = self.replayer.job(self.name, sid, entrypoint, env)
            return True

    def stop_job(self, sid: str) -> bool:
        with self.lock:
            job = self.replays.get(sid)
            if job is None or job.status(time.time()) != "RUNNING":
                return False
            job.stopped_at, job.message = time.time(), "Job was intentionally stopped."
            self.replayer.stopped.append(sid)
            return True


class ReplayNodes(StubNodes):
    """A replay node per instance (see the module docstring), up `delay_s` after it was started. Nodes
    started from one backend share its Replayer: `train_s` and the journal (`home/replay-jobs.jsonl`)."""

    def __init__(self, home: Path | None = None, delay_s: float = 0.2, train_s: float = TRAIN_S) -> None:
        super().__init__(delay_s)
        self.replayer = Replayer(train_s, home / JOURNAL if home is not None else None)

    @property
    def train_s(self) -> float:
        return self.replayer.train_s

    @train_s.setter
    def train_s(self, seconds: float) -> None:
        self.replayer.train_s = seconds

    def start(self, name: str, boot: Boot) -> None:
        """Serve the node's replay head in a daemon thread (returns at once); it joins no cluster."""
        server = _ReplayServer(name, boot.token or secrets.token_hex(16), self.replayer)
        threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True).start()
        with self._lock:
            old = self._started.pop(name, None)
            self._started[name] = (time.time(), server)
        if old is not None:
            _close_later(old[1])

    def stop(self, name: str, notice_s: float = 0.0) -> None:
        """Stop the node's server, not waiting for its loop to notice (a fake calls this under its lock);
        a replay keeps nothing, so `notice_s` changes nothing."""
        with self._lock:
            started = self._started.pop(name, None)
        if started is not None:
            _close_later(started[1])


def _close_later(server: _StubServer) -> None:
    """End the server in the background: its loop notices within POLL_S, and a fake's lock is not held
    that long (the fleet has stopped using the node by then)."""
    threading.Thread(target=_shut, args=(server,), daemon=True).start()


def _shut(server: _StubServer) -> None:
    server.shutdown()
    server.server_close()
