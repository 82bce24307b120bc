"""Running the fake clouds as their own processes, as a user would, and watching them during a run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.factories import (
    EXAMPLE_YAML,
    RUNPOD_SECTION,
    VASTAI_SECTION,
    copy_example_data,
    light_job_file,
)
from tests.fakes import FakeCloud, FakeRunPod
from tests.integration.fleetproc import REPO, events_of, fleet, fleet_env

API_KEY = "fake-runpod-key-0123456789"
VAST_KEY = "fake-vast-key-9876543210"
HF_TOKEN = "hf_fakecloudcanary0123456789abcdefghij"


@contextmanager
def serving(vendor: str, fake_home: Path, api_key: str) -> Iterator[str]:
    """`python -m tests.fakes serve VENDOR` as its own process, as a user would run it; yields its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes", "serve", vendor, "--nodes", "ray", "--node-cpus", "2",
         "--home", str(fake_home), "--api-key", api_key],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def failed_run(
    fake: FakeCloud, home: Path, tmp_path: Path, keys: str = "", **settings: str
) -> tuple[dict[str, Any], list[Any]]:
    """`fleet run` of a light job on an in-process fake's cloud (its section, plus `keys`: indented
    lines), with `settings` in its environment, which must fail: the run's status view and its events."""
    if isinstance(fake, FakeRunPod):
        env = fleet_env(home, RUNPOD_API_BASE_URL=fake.url, RUNPOD_API_KEY=API_KEY, **settings)
        section = RUNPOD_SECTION
    else:
        env = fleet_env(home, VAST_URL=fake.url, VAST_API_KEY=VAST_KEY, **settings)
        section = VASTAI_SECTION
    done = fleet(env, "run", str(light_job_file(tmp_path / "job", section + keys)), "--json", timeout=120)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    view = json.loads(done.stdout)
    return view, events_of(home, view["run_id"])


def fake_state(url: str) -> dict[str, list[dict[str, object]]]:
    with urllib.request.urlopen(f"{url}/_fake/state", timeout=10) as reply:
        state: dict[str, list[dict[str, object]]] = json.loads(reply.read())
    return state


class MostLive:
    """Samples the fake's live instances while a run goes on; `most` is the largest count seen."""

    def __init__(self, url: str) -> None:
        self.url, self.most, self._stop = url, 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.most = max(self.most, len(fake_state(self.url)["instances"]))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.most


def job_for(tmp_path: Path, section: str, extra: str = "") -> Path:
    """The example job with its `local:` section swapped for `section` (and `extra` keys added), its data
    in a folder of its own. Its `ray_num_workers: 2` is dropped: one Ray worker per GPU of the section's
    pods (jobs.topology), as two fit only where there are two GPUs (a cluster of two pods)."""
    job = tmp_path / "job" / "tiny.yml"
    job.parent.mkdir()
    text = EXAMPLE_YAML.read_text().replace("ray_num_workers: 2\n", "")
    job.write_text(text.replace("local:\n  one_shot: true\n", extra + section))
    copy_example_data(job.parent)
    return job
