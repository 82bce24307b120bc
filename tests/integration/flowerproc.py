"""`fleet flower` in a subprocess for a test: `with flower(env, log_path) as at:` yields a `FlowerAt` (its
base URL, the process and its user:password: FLOWER_BASIC_AUTH from `env`, else the one it generated in
`<FLEET_HOME>/flower/basic-auth`) once the API answers with it, and stops it (its whole process group)
afterwards. Start it before the workers: Flower only knows the tasks whose events it saw."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.fleetproc import REPO, wait_until


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class FlowerAt:
    """A running `fleet flower`: its base URL, its process and the user:password it takes."""

    url: str
    proc: subprocess.Popen[bytes]
    credential: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(self.credential.encode()).decode()}


def get_json(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> Any:
    """GET `url` (with `headers`) and decode its JSON body (raises urllib's errors)."""
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def api_tasks(at: FlowerAt) -> dict[str, dict[str, Any]]:
    """Flower's /api/tasks: every task it knows, by task id (name, args, kwargs, state, worker, ...)."""
    tasks: dict[str, dict[str, Any]] = get_json(f"{at.url}/api/tasks", headers=at.headers())
    return tasks


def _credential(env: dict[str, str]) -> str | None:
    """Flower's user:password: the environment's, else the file it generates on its first start."""
    if env.get("FLOWER_BASIC_AUTH"):
        return env["FLOWER_BASIC_AUTH"].split(",")[0]
    path = Path(env["FLEET_HOME"]) / "flower" / "basic-auth"
    return path.read_text(encoding="utf-8").strip() if path.exists() else None


@contextlib.contextmanager
def flower(env: dict[str, str], log_path: Path, timeout: float = 60.0) -> Iterator[FlowerAt]:
    """Run `fleet flower --port <free port>` with `env` (its output appended to `log_path`)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet", "flower", "--port", str(port)],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:

            def up() -> FlowerAt | None:
                if proc.poll() is not None:
                    raise AssertionError(f"fleet flower exited with {proc.returncode}; see {log_path}")
                credential = _credential(env)
                if credential is None:
                    return None
                at = FlowerAt(url, proc, credential)
                try:
                    api_tasks(at)
                    return at
                except (urllib.error.URLError, OSError, ValueError):
                    return None

            yield wait_until(up, timeout, "flower's HTTP API")
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
