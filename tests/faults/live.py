"""A live fleet for one fault case: the real `fleet` CLI in subprocesses (workers with beat, the notifier)
on a private home with its embedded Redis, the clouds and the Hub as in-process fakes, and the faults a
test applies to them: kill -9 of a whole worker, SIGKILL of Redis and its restart.

Everything it starts is registered with the case (for the invariant checker) and stopped after the check.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import redis

from service.embedded import _locked, ensure_redis, launch  # the embedded Redis's own start and lock
from state.ledger import Ledger
from state.models import Run
from tests.fakes import FakeCloud, FakeDiscord, FakeHub
from tests.faults.canaries import CANARIES
from tests.faults.case import Case
from tests.faults.direct import NOWHERE
from tests.integration.fleetproc import REPO, Worker, cleanup, fleet_env, fleet_json, wait_until

Event = dict[str, Any]
ENDS = ("run.succeeded", "run.failed", "run.cancelled")


class FaultWorker(Worker):
    """`fleet up` (one worker on every queue, with beat) that a test can kill as a whole."""

    killed = False

    def kill_group(self) -> None:
        """SIGKILL the worker's whole process group (main process, pool children, embedded beat) at once,
        then anything of it that left the group."""
        self.killed = True
        procs: list[psutil.Process] = []
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(self.proc.pid))
            procs += procs[0].children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=30)
        self.proc.wait(10)
        self._log.close()


class LiveFleet:
    """One fleet home and the processes a case runs on it."""

    def __init__(self, case: Case, home: Path, clouds: Sequence[FakeCloud] = (), **settings: str) -> None:
        self.case, self.home = case, home
        self.hub = case.stack.enter_context(FakeHub(home=home.parent / "hub", token=CANARIES["HF_TOKEN"]))
        urls = {"runpod": "RUNPOD_API_BASE_URL", "vastai": "VAST_URL"}
        endpoints = {name: NOWHERE for name in urls.values()}  # never the real APIs, with canary keys
        endpoints.update({urls[fake.vendor]: fake.url for fake in clouds})
        self.settings = {
            **CANARIES,
            **endpoints,
            "HF_ENDPOINT": self.hub.url,
            "HF_HUB_DISABLE_XET": "1",
            **settings,
        }
        self.env = fleet_env(home, **self.settings)
        ensure_redis(home)
        self.redis: redis.Redis[str] = redis.Redis.from_url(self.url(), decode_responses=True)
        self.ledger = Ledger(self.redis)
        self.workers: list[FaultWorker] = []
        self.others: list[subprocess.Popen[bytes]] = []
        self._logs = 0
        self._supervising: threading.Event | None = None
        self.restarts = 0  # workers the supervisor started again after they exited by themselves
        case.watch_home(home)
        case.watch_redis(self.url)
        case.watch_published(home.parent / "hub")
        for fake in clouds:
            case.watch_cloud(fake)
        # Long enough for the orphan grace and a few reap passes (each case's run has ended by then).
        case.settle_s = (
            float(self.env["FLEET_ORPHAN_GRACE_S"]) + 5 * float(self.env["FLEET_REAP_INTERVAL_S"]) + 5
        )
        case.stack.callback(self.close)

    def url(self) -> str:
        return (self.home / "redis" / "url").read_text().strip()

    def _log(self, what: str) -> Path:
        self._logs += 1
        path = self.home / "logs" / f"{self._logs:02d}-{what}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.case.watch_log(path)
        return path

    # -- processes -----------------------------------------------------------------------------------
    def worker(self, home: Path | None = None, **env: str) -> FaultWorker:
        """Start `fleet up`; `env` adds to the fleet's environment (e.g. FLEET_CRASH_AT). With `home`, the
        worker runs as on another machine: a home of its own, this fleet's Redis (REDIS_URL)."""
        base = self.env
        if home is not None:
            base = fleet_env(home, **self.settings, REDIS_URL=self.url())
            self.case.watch_home(home)
            self.case.stack.callback(cleanup, home)
        worker = FaultWorker({**base, **env}, self._log("worker"))
        self.workers.append(worker)
        return worker

    def supervise(self, every_s: float = 0.5) -> None:
        """Start `fleet up` again whenever the current worker exits by itself, as a process supervisor
        (systemd's Restart=always) would; `restarts` counts how often that was needed."""
        stop = self._supervising = threading.Event()

        def watch() -> None:
            while not stop.wait(every_s):
                current = self.workers[-1] if self.workers else None
                if current is not None and not current.killed and current.proc.poll() is not None:
                    self.restarts += 1
                    self.worker()

        threading.Thread(target=watch, name="supervisor", daemon=True).start()

    def kill(self, worker: FaultWorker, where: str) -> None:
        """kill -9 the whole worker, counted as a fault injected at `where`."""
        worker.kill_group()
        self.case.inject(f"kill:{where}")

    def notifier(self, discord: FakeDiscord, channel: int = 424242424242424242) -> None:
        """`fleet notify` posting the fleet's events through a webhook of the fake Discord."""
        hook_id, token = discord.add_webhook(channel)
        env = {
            **self.env,
            "FLEET_DISCORD_WEBHOOK_URL": f"{discord.url}/api/webhooks/{hook_id}/{token}",
            "FLEET_DISCORD_API_BASE": f"{discord.url}/api/v10",
        }
        log = open(self._log("notify"), "ab")  # noqa: SIM115 - closed by the case's stack
        self.case.stack.callback(log.close)
        self.others.append(
            subprocess.Popen(
                [sys.executable, "-m", "fleet", "notify"],
                env=env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        self.case.watch_discord(discord)

    def close(self) -> None:
        if self._supervising is not None:
            self._supervising.set()
        for worker in self.workers:
            worker.stop()
        for proc in self.others:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.redis.close()
        cleanup(self.home)

    # -- runs and events -----------------------------------------------------------------------------
    def enqueue(self, job: Path) -> str:
        (queued,) = fleet_json(self.env, "enqueue", str(job))
        return str(queued["run_id"])

    def events(self, run_id: str) -> list[Event]:
        entries = self.redis.xrange(f"tf:events:{run_id}")
        return [json.loads(fields["event"]) for _sid, fields in entries]

    def kinds(self, run_id: str) -> list[str]:
        return [e["type"] for e in self.events(run_id)]

    def wait_event(
        self, run_id: str, kind: str, timeout: float = 300, where: Callable[[Event], bool] | None = None
    ) -> Event:
        """The run's first event of `kind` (matching `where`), as soon as it is there (polled every 0.1 s);
        fails at once if the run ends first."""

        def found() -> Event | None:
            evs = self.events(run_id)
            hit = next((e for e in evs if e["type"] == kind and (where is None or where(e))), None)
            if hit is None:
                ended = [e["type"] for e in evs if e["type"] in ENDS]
                assert not ended, f"run {run_id} ended ({ended}) before {kind}: {evs[-3:]}"
            return hit

        event: Event = wait_until(found, timeout, kind, every=0.1)
        return event

    def run(self, run_id: str) -> Run:
        return self.ledger.get_run(run_id)

    # -- Redis ---------------------------------------------------------------------------------------
    def restart_redis(self, down_s: float = 1.5) -> None:
        """SIGKILL the embedded redis-server (no shutdown save: the AOF has what was fsynced, every second)
        and start it again `down_s` later on the same socket and AOF directory. Done under the embedded
        Redis's own lock, so no `fleet` command starts a second one meanwhile."""
        base = self.home / "redis"
        with _locked(base / "lock"):
            pid = int((base / "redis.pid").read_text().strip())
            proc = psutil.Process(pid)
            proc.kill()
            proc.wait(10)
            time.sleep(down_s)
            launch(base / "redis.conf", timeout_s=30)  # as the fleet starts it: umask 077
            wait_until(self._answers, 15, "redis to answer again", every=0.05)
        self.case.inject("redis:sigkill_restart")

    def _answers(self) -> bool:
        try:
            return bool(self.redis.ping())
        except redis.RedisError:
            return False
