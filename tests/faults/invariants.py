"""The invariants every fault case keeps, checked by one function after each case (reliability notes §3):

- I1 duplicates: at most one live instance per run attempt at any moment. The fake clouds record, per
  instance name, the most instances of that name ever live at once; local Ray heads are sampled.
- I2 leaked: no live instance once the runs ended plus a reap cycle (fake clouds' lists, local heads).
- I3 not_terminal: every run ends SUCCEEDED, FAILED or CANCELLED, and in the state the case expects.
- I4 secret_hits: no canary secret in any Redis key or value (Celery messages decoded), any log or file
  of the fleet (its home, the Redis AOF included; a node's own token file excepted), anything published
  to the Hub, or any Discord message. The fake clouds' own records are not searched: they are the
  vendor, which legitimately receives the keys (and a node legitimately holds HF_TOKEN in its env).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import redis

from core.errors import FleetError, NotFound, clipped
from providers.base import INSTANCE_PREFIX
from providers.local.client import LocalHeads
from state.ledger import Ledger
from state.stages import RunState
from tests.faults.case import Case, Findings

CRASH_LINE = re.compile(rb"fleet: crash point (\w+): exiting")


def check(case: Case) -> Findings:
    """Wait for the case's runs to end, let the reaper settle, then collect every finding."""
    clients = case.clients()
    findings = Findings()
    case.ended = wait_for_ends(clients, list(case.expected), case.end_timeout_s)
    for run_id, want in case.expected.items():
        got = case.ended.get(run_id, "missing")
        if got == "missing" or not RunState(got.split()[0]).is_terminal():
            findings.not_terminal.append(f"{run_id}: {got}")
        elif got.split()[0] != want.value:
            findings.wrong_end.append(f"{run_id}: {got}; expected {want.value}")
    findings.leaked = settle(case)
    findings.duplicates = duplicates(case)
    findings.secret_hits = secret_hits(case, clients)
    count_served(case)
    for client in clients:
        client.close()
    return findings


# -- I3 ---------------------------------------------------------------------------------------------
def wait_for_ends(clients: list[redis.Redis[str]], run_ids: list[str], timeout_s: float) -> dict[str, str]:
    """Each run's state ("FAILED (REASON: message)" when it failed), once all ended or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = {run_id: state_of(clients, run_id) for run_id in run_ids}
        ended = all(s.split()[0] in {r.value for r in RunState if r.is_terminal()} for s in states.values())
        if ended or time.monotonic() > deadline:
            return states
        time.sleep(1.0)


def state_of(clients: list[redis.Redis[str]], run_id: str) -> str:
    for client in clients:
        try:
            run = Ledger(client).get_run(run_id)
        except NotFound:
            continue
        except redis.RedisError as exc:
            return f"unreadable ({type(exc).__name__})"
        if run.failure_reason is not None:
            why = clipped(run.failure_message or "", 1200)  # what failed, and a traceback's cause
            return f"{run.state.value} ({run.failure_reason.value}: {why})"
        return run.state.value
    return "missing"


# -- I2 ---------------------------------------------------------------------------------------------
def live_instances(case: Case) -> list[str]:
    """Every instance of ours (named tf-...) still alive: on the fake clouds, and local Ray heads (by
    their processes). Anybody else's instances on a shared account are not the fleet's to end."""
    live = []
    for fake in case.clouds:
        rows = [row for row in fake.state()["instances"] if str(row["name"]).startswith(INSTANCE_PREFIX)]
        live += [f"{fake.vendor}:{row['name']}:{row['id']}" for row in rows]
    for home in case.homes:
        live += [f"local:{name}" for name in sorted(heads_per_name(home))]
    return live


def settle(case: Case) -> list[str]:
    """Wait up to `settle_s` for the live instances to go (running the case's reaper each second, when
    it has one of its own); what is still alive then has leaked."""
    deadline = time.monotonic() + case.settle_s
    while live := live_instances(case):
        if time.monotonic() > deadline:
            return live
        if case.reaper is not None:
            with contextlib.suppress(FleetError, redis.RedisError):  # the next pass tries again
                case.reaper()
        time.sleep(1.0)
    return []


# -- I1 ---------------------------------------------------------------------------------------------
def heads_per_name(home: Path) -> dict[str, int]:
    """How many `ray start --head` processes run now for each local head name under `home` (a second head
    started under one name shares the first one's temp dir, so both are found). A process whose parent is
    one of them is not counted: Ray starts its own processes with a `preexec_fn`, so each child is, from
    fork to exec, a copy of `ray start` with the same command line."""
    heads = LocalHeads(home / "nodes")
    temp_dirs = {}
    for name in heads.names():
        meta = heads.read(name)
        if meta is not None:
            temp_dirs[f"--temp-dir={meta.temp_dir}"] = name
    if not temp_dirs:
        return {}
    found: dict[int, tuple[str, int]] = {}  # pid -> (name, parent pid)
    for proc in psutil.process_iter():
        try:  # its own read: `proc.info` is shared with other threads' process_iter (LocalHeads.processes)
            info = proc.as_dict(["cmdline", "status", "ppid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        cmdline = info["cmdline"] or []
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if "start" in cmdline and "--head" in cmdline:
            for arg in cmdline:
                if arg in temp_dirs:
                    found[proc.pid] = (temp_dirs[arg], info["ppid"])
    counts = Counter(name for name, parent in found.values() if found.get(parent, ("",))[0] != name)
    return dict(counts)


def duplicates(case: Case) -> list[str]:
    """Names that ever had more than one live instance at once."""
    found = []
    seen: dict[str, int] = {}
    for fake in case.clouds:
        most: dict[str, int] = fake.state()["most_live"]
        seen.update({f"{fake.vendor}:{name}": n for name, n in most.items()})
    for home, sampler in zip(case.homes, case.samplers, strict=True):
        most = sampler.stop()
        for name, n in heads_per_name(home).items():
            most[name] = max(most.get(name, 0), n)
        seen.update({f"local:{name}": n for name, n in most.items()})
    case.notes["most_live"] = seen  # the witnesses themselves, so a record shows they looked
    found += [f"{name} x{n}" for name, n in sorted(seen.items()) if n > 1]
    return found


# -- I4 ---------------------------------------------------------------------------------------------
def secret_hits(case: Case, clients: list[redis.Redis[str]]) -> list[str]:
    """Where any canary value shows up (empty: nowhere)."""
    hits = []
    for index, client in enumerate(clients):
        for key, text in redis_texts(client):
            hits += [f"{name} in redis[{index}]:{key}" for name, v in case.secrets.items() if v in text]
    files = set(case.logs)
    for home in case.homes:
        files |= {p for p in home.rglob("*") if p.is_file() and p.name != "token"}
    for folder in case.published:
        files |= {p for p in folder.rglob("*") if p.is_file()}
    for path in sorted(files):
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            hits += [f"{name} in {path}" for name, v in case.secrets.items() if v.encode() in data]
    for fake in case.discords:
        shown = json.dumps(fake.state())
        hits += [f"{name} in discord" for name, v in case.secrets.items() if v in shown]
    return hits


def redis_texts(client: redis.Redis[str]) -> Iterator[tuple[str, str]]:
    """(key, text) for every value in every key, whatever its type; Celery messages (whose bodies, the
    task arguments, are base64) are decoded too."""
    for key in client.scan_iter("*", count=500):
        kind = client.type(key)  # type: ignore[no-untyped-call]
        values: list[str]
        if kind == "string":
            values = [client.get(key) or ""]
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind == "hash":
            values = [f"{k}={v}" for k, v in client.hgetall(key).items()]
        elif kind == "set":
            values = list(client.smembers(key))
        elif kind == "zset":
            values = [str(member) for member in client.zrange(key, 0, -1)]
        elif kind == "stream":
            values = [json.dumps(fields) for _sid, fields in client.xrange(key)]
        else:
            values = [f"<unread type {kind}>"]
        for value in values:
            for text in _with_decoded(value):
                yield key, text


def _with_decoded(value: str) -> Iterator[str]:
    yield value
    try:
        parsed = json.loads(value)
    except ValueError:
        return
    yield from _bodies(parsed)


def _bodies(node: Any) -> Iterator[str]:
    """The base64 bodies of Celery (kombu) messages anywhere inside a parsed JSON value, decoded."""
    if isinstance(node, dict):
        if node.get("body_encoding") == "base64" and isinstance(node.get("body"), str):
            with contextlib.suppress(binascii.Error, UnicodeDecodeError):
                yield base64.b64decode(node["body"]).decode()
        for child in node.values():
            yield from _bodies(child)
    elif isinstance(node, list):
        for child in node:
            yield from _bodies(child)


# -- what was served ----------------------------------------------------------------------------------
def count_served(case: Case) -> None:
    """Add to the case's injected faults those the fakes served and the crash points the logs show."""
    for fake in case.clouds:
        for served, n in fake.state()["faults_served"].items():
            case.inject(f"api:{fake.vendor}:{served}", n)
    for path in case.logs:
        with contextlib.suppress(OSError):
            for point in CRASH_LINE.findall(path.read_bytes()):
                case.inject(f"crash:{point.decode()}")
