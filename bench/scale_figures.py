"""bench/scale.py's figures, from what it gathered: the samplers' samples, the runs' event streams, the
replay nodes' journals, the workers' logs and the fake Discord's messages. Plain functions, no I/O but the
logs they are given."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.scale_sample import Sample

EMITTED = "replay_emitted_at"  # tests.fakes.replay.EMITTED: when the node put the line in its log
Stream = list[tuple[str, dict[str, Any]]]  # a run's events: (stream entry id, event)
RECEIVED = re.compile(r"Task (?P<name>[\w.]+)\[(?P<id>[\w-]+)\] received")
SUCCEEDED = re.compile(r"Task (?P<name>[\w.]+)\[(?P<id>[\w-]+)\] succeeded in (?P<s>[\d.]+)s")
# A node job's end -> the ledger event that acts on it (the next stage's start, or the run's end).
TRANSITIONS = {
    "check": ("check_end_to_prepare", "stage.started", "prepare"),
    "fetch": ("fetch_end_to_train", "stage.started", "train"),
    "train": ("train_end_to_finalize", "stage.started", "finalize"),
    "pack": ("pack_end_to_succeeded", "run.succeeded", None),
}


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def spread(values: Iterable[float]) -> dict[str, Any]:
    """n, p50, p99, max (seconds, 3 decimals); only n when there are none."""
    found = list(values)
    if not found:
        return {"n": 0}
    return {
        "n": len(found),
        "p50": round(percentile(found, 50), 3),
        "p99": round(percentile(found, 99), 3),
        "max": round(max(found), 3),
    }


def ledger_at(entry_id: str) -> float:
    """When Redis added a stream entry (its id's milliseconds)."""
    return int(entry_id.split("-", 1)[0]) / 1000


# -- provider API calls ---------------------------------------------------------------------------------
def peak_rate(points: list[tuple[float, int]], window_s: float = 1.0) -> float:
    """The highest rate of a counter over any window of at least `window_s` between two samples."""
    best, j = 0.0, 0
    for i in range(1, len(points)):
        while j + 1 < i and points[i][0] - points[j + 1][0] >= window_s:
            j += 1
        span = points[i][0] - points[j][0]
        if span >= window_s * 0.9:
            best = max(best, (points[i][1] - points[j][1]) / span)
    return round(best, 2)


def most_in_window(times: list[float], window_s: float = 1.0) -> int:
    """The most of `times` within any window [t, t + window_s)."""
    ordered, most, j = sorted(times), 0, 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < start + window_s:
            j += 1
        most = max(most, j - i)
    return most


def api_calls(
    samples: list[Sample], vendor: str, runs: int, wall_s: float, listed_at: list[float]
) -> dict[str, Any]:
    """One fake cloud's requests: in all and per operation, per run, mean and peak per second (sampled
    counters: a window is 0.9 s or more between two samples); for the list, also the most list requests
    within any one second, from the fake's own times of them (`most_in_1s`)."""
    first, last = samples[0].requests.get(vendor, {}), samples[-1].requests.get(vendor, {})
    ops = sorted(set(last) | set(first))

    def series(op: str | None) -> list[tuple[float, int]]:
        return [
            (s.at, sum(n for o, n in s.requests.get(vendor, {}).items() if op in (None, o))) for s in samples
        ]

    def row(op: str | None) -> dict[str, Any]:
        total = series(op)[-1][1] - series(op)[0][1]
        return {
            "total": total,
            "per_run": round(total / max(runs, 1), 2),
            "mean_per_s": round(total / max(wall_s, 1e-9), 2),
            "peak_per_s": peak_rate(series(op)),
        }

    by_op = {op: row(op) for op in ops if last.get(op, 0) - first.get(op, 0)}
    if "list" in by_op:
        since, until = samples[0].at, samples[-1].at
        by_op["list"]["most_in_1s"] = most_in_window([t for t in listed_at if since <= t <= until])
    return {**row(None), "by_op": by_op}


# -- the ledger's events ----------------------------------------------------------------------------------
def node_to_ledger(streams: dict[str, Stream]) -> list[float]:
    """Seconds from each replayed line's appearance in its node's log to its event in the ledger."""
    return [
        ledger_at(sid) - float(event["data"][EMITTED])
        for stream in streams.values()
        for sid, event in stream
        if isinstance(event.get("data"), dict) and EMITTED in event["data"]
    ]


def _status_posts(discord: dict[str, Any]) -> dict[str, list[float]]:
    """Per run, when its status message was created and each time it was edited: in the run's thread (a
    channel of its own, bot.notifier), or in the channel for a run whose thread is gone."""

    def at(version: dict[str, Any]) -> float:
        return datetime.fromisoformat(version["at"]).timestamp()

    posts: dict[str, list[float]] = {}
    for message in (m for messages in discord.get("channels", {}).values() for m in messages):
        if message.get("embeds"):
            run_id = str(message["embeds"][0].get("title", "")).split(" · ")[0]
            posts.setdefault(run_id, []).extend(at(v) for v in [message["created"], *message["edits"]])
    return {run_id: sorted(times) for run_id, times in posts.items()}


def node_to_discord(streams: dict[str, Stream], discord: dict[str, Any]) -> dict[str, Any]:
    """Seconds from each replayed line's appearance on its node to the first post of its run's status
    message (created or edited) at or after the line's event reached the ledger (as bench/notify.py
    counts a status event), and how many lines had none."""
    posts = _status_posts(discord)
    found, missing = [], 0
    for run_id, stream in streams.items():
        for sid, event in stream:
            data = event.get("data")
            if not isinstance(data, dict) or EMITTED not in data:
                continue
            after = [t for t in posts.get(run_id, []) if t >= ledger_at(sid) - 0.001]
            if after:
                found.append(after[0] - float(data[EMITTED]))
            else:
                missing += 1
    return {**spread(found), "not_posted": missing}


def _firsts(stream: Stream) -> dict[tuple[str, str | None], float]:
    """The ledger time of each (event type, stage) pair's first event in a run."""
    firsts: dict[tuple[str, str | None], float] = {}
    for sid, event in stream:
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        firsts.setdefault((event["type"], data.get("stage")), ledger_at(sid))
    return firsts


def transitions(streams: dict[str, Stream], journal: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds from a node job's end (the replay journal's `ends`, the last such job of each run) to the
    ledger event that acts on it; and from `run.queued` to the provision task's start."""
    last_job: dict[tuple[str, str], float] = {}
    for row in sorted(journal, key=lambda r: float(r["started"])):
        run_id = "-".join(str(row["sid"]).split("-")[:3])  # service.runs.new_run_id: yymmdd-hhmmss-xxxx
        last_job[(run_id, str(row["kind"]))] = float(row["ends"])
    found: dict[str, list[float]] = {name: [] for name, _t, _s in TRANSITIONS.values()}
    found["queued_to_provision"] = []
    for run_id, stream in streams.items():
        firsts = _firsts(stream)
        queued, provision = firsts.get(("run.queued", None)), firsts.get(("stage.started", "provision"))
        if queued is not None and provision is not None:
            found["queued_to_provision"].append(provision - queued)
        for kind, (name, etype, stage) in TRANSITIONS.items():
            ended, acted = last_job.get((run_id, kind)), firsts.get((etype, stage))
            if ended is not None and acted is not None:
                found[name].append(acted - ended)
    node_ends = [v for name, values in found.items() if name != "queued_to_provision" for v in values]
    return {"node_job_end_to_next": spread(node_ends), **{k: spread(v) for k, v in found.items()}}


def run_figures(streams: dict[str, Stream]) -> dict[str, Any]:
    """Each run's time from queued to its end; each stage's seconds; retries and failures by why."""
    durations, stages, retries, failures = [], {}, Counter[str](), Counter[str]()
    for stream in streams.values():
        firsts = _firsts(stream)
        ends = [t for (etype, _s), t in firsts.items() if etype in ("run.succeeded", "run.failed")]
        if ends and ("run.queued", None) in firsts:
            durations.append(min(ends) - firsts[("run.queued", None)])
        for _sid, event in stream:
            data = event.get("data") or {}
            if event["type"] == "stage.finished":
                stages.setdefault(str(data.get("stage")), []).append(float(data.get("seconds") or 0))
            elif event["type"] == "run.retrying":
                retries[f"{data.get('stage')}: {str(data.get('error'))[:90]}"] += 1
            elif event["type"] == "run.failed":
                failures[f"{data.get('reason')}: {str(data.get('error') or data.get('message'))[:120]}"] += 1
    return {
        "queued_to_end_s": spread(durations),
        "stage_s": {stage: spread(values) for stage, values in stages.items()},
        "retries": dict(retries.most_common(8)),
        "failures": dict(failures.most_common(8)),
    }


def end_of_runs(streams: dict[str, Stream]) -> float | None:
    """When the last run ended, by the ledger (its terminal event)."""
    ends = [
        ledger_at(sid)
        for stream in streams.values()
        for sid, event in stream
        if event["type"] in ("run.succeeded", "run.failed", "run.cancelled")
    ]
    return max(ends, default=None)


# -- Celery and Redis ---------------------------------------------------------------------------------
def celery_tasks(logs: Path, runs: int) -> dict[str, Any]:
    """The tasks the workers received (their INFO log lines), per task name and per run, and the mean
    seconds each took."""
    received, took = Counter[str](), dict[str, list[float]]()
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if match := RECEIVED.search(line):
                received[match["name"]] += 1
            elif match := SUCCEEDED.search(line):
                took.setdefault(match["name"], []).append(float(match["s"]))
    stages = sum(n for name, n in received.items() if name != "trainfleet.reap")
    return {
        "per_run": round(stages / max(runs, 1), 2),
        "total": sum(received.values()),
        "by_task": dict(sorted(received.items())),
        "by_task_per_run": {k: round(n / max(runs, 1), 2) for k, n in sorted(received.items())},
        "mean_task_s": {k: round(sum(v) / len(v), 4) for k, v in sorted(took.items())},
        "how": "`Task NAME[id] received` lines in the workers' logs (reap tasks not in per_run)",
    }


def redis_commands(
    before: dict[str, Any], after: dict[str, Any], own: Counter[str], runs: int
) -> dict[str, Any]:
    """The fleet's Redis commands between two INFO snapshots (`stats` and `commandstats` merged), less
    the bench's own (`own`, by command); the busiest commands; the list pushes (Celery messages sent)."""

    def calls(info: dict[str, Any], name: str) -> int:
        stat = info.get(f"cmdstat_{name}")
        return int(stat["calls"]) if isinstance(stat, dict) else 0

    names = {k.removeprefix("cmdstat_") for k in after if k.startswith("cmdstat_")}
    deltas = Counter({n: calls(after, n) - calls(before, n) - own[n] for n in names})
    total = int(after["total_commands_processed"]) - int(before["total_commands_processed"]) - own.total()
    pushes = deltas["lpush"] + deltas["rpush"]
    return {
        "total": total,
        "per_run": round(total / max(runs, 1), 1),
        "busiest": dict(deltas.most_common(10)),
        "list_pushes": pushes,
        "list_pushes_per_run": round(pushes / max(runs, 1), 2),
        "how": "INFO total_commands_processed delta, less the bench's own commands; list pushes: LPUSH+RPUSH",
    }
