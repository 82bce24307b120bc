"""Running the real `fleet` CLI in subprocesses against a private fleet home (its own embedded Redis,
its own Ray heads), and cleaning all of it up afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import redis

from providers.base import ProviderContext
from providers.local.provider import LocalProvider
from service.embedded import stop_redis
from state.keys import run_key, tick_key

REPO = Path(__file__).resolve().parents[2]


NOWHERE = "http://127.0.0.1:9"  # a cloud a test runs no fake of: refused at once, never the real API


def fleet_env(home: Path, **settings: str) -> dict[str, str]:
    """The environment of a test fleet: fast polling and reaping, everything under `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_")) and k != "REDIS_URL"}
    env.update(
        FLEET_HOME=str(home),
        FLEET_SETTINGS_FILE=str(home / "no-settings.yml"),
        FLEET_SECRETS_FILE=str(home / "no-secrets.yml"),
        FLEET_POLL_INTERVAL_S="0.5",
        FLEET_STALL_AFTER_S="8",
        FLEET_REAP_INTERVAL_S="2",
        FLEET_ORPHAN_GRACE_S="5",
        PYTHONUNBUFFERED="1",
    )
    home.mkdir(parents=True, exist_ok=True)
    (home / "no-settings.yml").write_text("{}\n")
    env.update(settings)
    runpod = settings.get("RUNPOD_API_BASE_URL")
    if runpod and runpod != NOWHERE:  # the fleet reaches pods through the fake's HTTPS proxy only
        from tests.fakes.runpod import proxy_settings

        env.update(
            {k: v for k, v in proxy_settings(settings["RUNPOD_API_BASE_URL"]).items() if k not in settings}
        )
    return env


def fleet(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def fleet_json(env: dict[str, str], *args: str, timeout: float = 300) -> Any:
    done = fleet(env, *args, "--json", timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


class Worker:
    """`fleet up` in the background (one worker on every queue plus beat), or the `fleet` command `args`."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self._log = open(log, "ab")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleet", *(args or ("up",))],
            env=env,
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the whole worker (main process and its pool children) at once."""
        procs = [psutil.Process(self.proc.pid)]
        with contextlib.suppress(psutil.NoSuchProcess):
            procs += procs[0].children(recursive=True)
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)
        psutil.wait_procs(procs, timeout=30)
        self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if not self._log.closed:
            self._log.close()


def redis_of(home: Path) -> redis.Redis[str]:
    url = (home / "redis" / "url").read_text().strip()
    return redis.Redis.from_url(url, decode_responses=True)


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def ledger_of(env: dict[str, str]) -> redis.Redis[str]:
    """A client on the Redis of the fleet that `env` describes (its REDIS_URL, or its home's embedded one)."""
    url = env.get("REDIS_URL") or (Path(env["FLEET_HOME"]) / "redis" / "url").read_text().strip()
    return redis.Redis.from_url(url, decode_responses=True)


def wait_for_end(env: dict[str, str], run_id: str, timeout: float = 360) -> dict[str, Any]:
    """The run's status view (`fleet status RUN --json`) once it is SUCCEEDED or FAILED. The wait reads the
    ledger itself: a `fleet` process every poll would take a core's worth of CPU from the run it waits on."""
    client = ledger_of(env)
    try:

        def ended() -> bool:
            raw = client.get(run_key(run_id))
            return raw is not None and json.loads(raw)["state"] in ("SUCCEEDED", "FAILED")

        wait_until(ended, timeout, "the run to end", every=1)
    finally:
        client.close()
    view: dict[str, Any] = fleet_json(env, "status", run_id)
    return view


def events_of(home: Path, run_id: str) -> list[dict[str, Any]]:
    client = redis_of(home)
    return [json.loads(fields["event"]) for _sid, fields in client.xrange(f"tf:events:{run_id}")]


def secret_hits(home: Path, secret: str) -> list[str]:
    """Where `secret` shows up: any Redis value (strings, lists, streams) or any file under `home`
    other than the secret's own 0600 file. Empty means nowhere."""
    hits = []
    client = redis_of(home)
    for key in client.scan_iter("*"):
        kind = client.type(key)  # type: ignore[no-untyped-call]
        if kind == "string":
            values = [client.get(key) or ""]
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind == "stream":
            values = [json.dumps(fields) for _sid, fields in client.xrange(key)]
        elif kind == "hash":
            values = [json.dumps(client.hgetall(key))]
        else:
            values = [json.dumps(sorted(client.smembers(key)))] if kind == "set" else []
        hits += [f"redis:{key}" for value in values if secret in value]
    for path in home.rglob("*"):
        if path.is_file() and path.name != "token" and secret.encode() in path.read_bytes():
            hits.append(str(path))
    return hits


def fleet_workers(home: Path) -> list[psutil.Process]:
    """The `fleet worker` processes serving `home` (by the FLEET_HOME in their environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            cmd = proc.cmdline()
            if cmd[1:4] == ["-m", "fleet", "worker"] and proc.environ().get("FLEET_HOME") == str(home):
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def workers_left(home: Path, within_s: float = 30.0) -> list[psutil.Process]:
    """The `fleet worker` processes of `home` still there after `within_s`: one `fleet run` stopped takes no
    task from then on and ends by itself once Celery's pool has wound down (seconds), not at once."""
    deadline = time.monotonic() + within_s
    while (left := fleet_workers(home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def live_heads(home: Path) -> list[str]:
    return [inst.name for inst in LocalProvider(ProviderContext(home=home)).list_instances()]


def cleanup(home: Path) -> list[str]:
    """Stop whatever a test left running under `home`; returns the heads that were still alive."""
    provider = LocalProvider(ProviderContext(home=home))
    left = [inst.name for inst in provider.list_instances()]
    for name in provider.heads.names():
        provider.terminate(name)
    stop_redis(home)
    return left


__all__ = ["fleet", "fleet_env", "fleet_json", "tick_key"]
