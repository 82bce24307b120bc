"""`fleet flower` in a subprocess for a test: `with flower(env, log_path) as url:` yields the base URL of its
web UI and HTTP API (bound to 127.0.0.1, so the API needs no password) once the API answers, and stops
it (its whole process group) afterwards. Start it before the workers: Flower only knows the tasks whose
events it saw."""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

from tests.integration.fleetproc import REPO, wait_until


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str, timeout: float = 5.0) -> Any:
    """GET `url` and decode its JSON body (raises urllib's errors)."""
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.loads(reply.read())


def api_tasks(url: str) -> dict[str, dict[str, Any]]:
    """Flower's /api/tasks: every task it knows, by task id (name, args, kwargs, state, worker, ...)."""
    tasks: dict[str, dict[str, Any]] = get_json(f"{url}/api/tasks")
    return tasks


def _answers(url: str) -> bool:
    try:
        get_json(f"{url}/api/tasks?limit=1", timeout=2.0)
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def flower(env: dict[str, str], log_path: Path, timeout: float = 60.0) -> Iterator[str]:
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

            def up() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"fleet flower exited with {proc.returncode}; see {log_path}")
                return _answers(url)

            wait_until(up, timeout, "flower's HTTP API")
            yield url
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
