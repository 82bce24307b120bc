"""A sweep's slots on a real Redis: at most max_parallel children active however many processes advance it at
once, waiting ones released in order as others end, one `sweep.finished` with the table, and cancel."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import sweeps as slots
from broker.queues import REAP_TASK
from core.errors import FailureReason, NotFound
from core.settings import Settings
from providers.world import World
from service import sweeps
from service.runs import Fleet
from service.sweep_load import load_sweep
from service.sweep_spec import SweepPlan
from state import events
from state.keys import EVENTS_STREAM, sweep_lock_key, tick_key, worker_key
from state.models import Run
from state.payloads import Event, EventType, SweepFinished
from state.stages import RunState, Stage
from tests.factories import light_job_file
from tests.integration.fleetproc import (
    events_of,
    fleet_env,
    fleet_json,
    fleet_workers,
    wait_until,
    workers_left,
)
from tests.integration.fleetproc import fleet as fleet_cli
from tests.integration.flowerproc import api_tasks, flower

pytestmark = pytest.mark.integration
CANARY = "canary-flower-credential-5f1e9a"
STAGE_TASKS = [stage.task_name for stage in Stage]


@pytest.fixture
def fleet(redis_client: redis.Redis[str], redis_url: str, tmp_path: Path) -> Iterator[Fleet]:
    home = tmp_path / "home"
    home.mkdir()
    connected = Fleet.connect(World.of(Settings(redis_url=redis_url, home=home)))
    yield connected
    connected.redis.close()


def plan_of(tmp_path: Path, max_parallel: int = 2) -> SweepPlan:
    job = light_job_file(tmp_path / "job")
    job.write_text(
        job.read_text() + "sweep:\n  grid:\n    learning_rate: [0.01, 0.02]\n    lora_r: [4, 8, 16]\n"
    )
    return load_sweep(job, max_parallel=max_parallel)


def runs_of(fleet: Fleet, sweep_id: str) -> list[Run]:
    sweep = fleet.ledger.get_sweep(sweep_id)
    found = fleet.ledger.get_runs(sweep.runs)
    return [found[r] for r in sweep.runs]


def active(runs: list[Run]) -> list[str]:
    return [r.run_id for r in runs if not r.held and not r.state.is_terminal()]


def end(fleet: Fleet, run_id: str, state: RunState, loss: float | None = None) -> None:
    def change(r: Run) -> None:
        r.state = state
        if loss is not None:
            r.metrics["eval_loss"] = loss
        if state == RunState.FAILED:
            r.failure_reason = FailureReason.TRAINING_FAILED

    fleet.ledger.update_run(run_id, change)


def test_at_most_max_parallel_active_and_the_rest_released_in_order(fleet: Fleet, tmp_path: Path) -> None:
    sweep = sweeps.submit_sweep(fleet, plan_of(tmp_path))
    runs = runs_of(fleet, sweep.sweep_id)
    assert len(runs) == 6
    assert active(runs) == [runs[0].run_id, runs[1].run_id]  # the first two were sent to provision
    assert all(fleet.redis.get(tick_key(r)) for r in active(runs))
    assert all(r.held and fleet.redis.get(tick_key(r.run_id)) is None for r in runs[2:])
    assert [r.params for r in runs[:2]] == [
        {"learning_rate": 0.01, "lora_r": 4},
        {"learning_rate": 0.01, "lora_r": 8},
    ]

    # Eight processes advancing at once release nothing while both slots are taken...
    threads = [
        threading.Thread(target=slots.advance, args=(fleet.ledger, fleet.dispatcher, sweep.sweep_id))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(active(runs_of(fleet, sweep.sweep_id))) == 2

    # ...and exactly one more when one child ends, however many of them race for it.
    end(fleet, runs[0].run_id, RunState.SUCCEEDED, loss=1.5)
    released: list[list[str]] = []
    threads = [
        threading.Thread(
            target=lambda: released.append(slots.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id))
        )
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r for batch in released for r in batch] == [runs[2].run_id]
    now = runs_of(fleet, sweep.sweep_id)
    assert active(now) == [runs[1].run_id, runs[2].run_id]
    kinds = [e.type for _sid, e in events.read_run(fleet.redis, runs[2].run_id)]
    assert kinds == [EventType.RUN_QUEUED, EventType.RUN_RELEASED]


def test_the_sweep_finishes_once_with_its_table_and_the_best_run(fleet: Fleet, tmp_path: Path) -> None:
    sweep = sweeps.submit_sweep(fleet, plan_of(tmp_path, max_parallel=6))
    runs = runs_of(fleet, sweep.sweep_id)
    losses = [1.4, 1.1, None, 1.3, 0.9, 1.2]
    for run, loss in zip(runs, losses, strict=True):
        end(fleet, run.run_id, RunState.FAILED if loss is None else RunState.SUCCEEDED, loss)
    for _ in range(3):
        slots.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id)
    everything = [Event.model_validate_json(f["event"]) for _sid, f in fleet.redis.xrange(EVENTS_STREAM)]
    finished = [e for e in everything if e.type == EventType.SWEEP_FINISHED]
    assert len(finished) == 1
    data = finished[0].data
    assert isinstance(data, SweepFinished) and data.state == "FAILED"  # one child failed
    assert [r.metric for r in data.rows] == losses
    assert [r.best for r in data.rows] == [False, False, False, False, True, False]
    view = sweeps.sweep_view(fleet, fleet.ledger.get_sweep(sweep.sweep_id))
    assert view.best_run == runs[4].run_id and view.finished_at is not None
    assert view.model_dump(mode="json", by_alias=True)["best"] == runs[4].run_id  # as --json prints it
    assert sweep.sweep_id not in fleet.ledger.active_sweeps()


def test_cancel_flags_every_child_and_releases_no_more(fleet: Fleet, tmp_path: Path) -> None:
    # A worker serves provision (its heartbeat), so a cancel flags the queued children for it to end them;
    # with none up, a queued run ends CANCELLED at once (tests/integration/test_cli.py).
    fleet.redis.set(worker_key("w1"), json.dumps({"queues": [Stage.PROVISION.value]}), ex=60)
    sweep = sweeps.submit_sweep(fleet, plan_of(tmp_path))
    runs = runs_of(fleet, sweep.sweep_id)
    assert fleet.ledger.find_sweep(sweep.sweep_id[:-2]).sweep_id == sweep.sweep_id  # a unique prefix
    with pytest.raises(NotFound, match="no sweep"):
        fleet.ledger.find_sweep("sw-nope")
    sweeps.cancel_sweep(fleet, sweep.sweep_id[:-2])
    assert all(r.cancel_requested for r in runs_of(fleet, sweep.sweep_id))
    end(fleet, runs[0].run_id, RunState.CANCELLED)
    assert slots.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id) == []
    view = sweeps.sweep_view(fleet, fleet.ledger.get_sweep(sweep.sweep_id))
    assert view.state == "CANCELLING"
    for run in runs[1:]:
        end(fleet, run.run_id, RunState.CANCELLED)
    slots.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id)
    assert sweeps.sweep_view(fleet, fleet.ledger.get_sweep(sweep.sweep_id)).state == "CANCELLED"


def test_a_lock_left_by_a_dead_process_only_delays_the_sweep(fleet: Fleet, tmp_path: Path) -> None:
    sweep = sweeps.submit_sweep(fleet, plan_of(tmp_path))
    runs = runs_of(fleet, sweep.sweep_id)
    end(fleet, runs[0].run_id, RunState.SUCCEEDED, loss=1.0)
    fleet.redis.set(sweep_lock_key(sweep.sweep_id), "dead", px=300)
    started = time.monotonic()
    assert slots.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id) == [runs[2].run_id]
    assert time.monotonic() - started >= 0.25


def test_a_four_run_grid_with_two_at_once_end_to_end_followed_in_flower(home: Path, tmp_path: Path) -> None:
    """The must-shows of sweeps and Flower, on one fleet (each run costs a Ray head and a training): the tiny
    job swept over learning_rate x lora_r on the local provider by `fleet sweep --wait` with no worker up (it
    starts one, as `fleet run` does, and stops it on its way out); all four succeed, never more than two are
    active at once, and the table marks the best. `fleet flower`, started first, lists each run's four stage
    tasks by name with the run id, and no credential of the fleet."""
    job = light_job_file(tmp_path / "job", extra="max_steps: 12\n")  # a few steps: the sweep is the point
    job.write_text(
        job.read_text()
        + "sweep:\n  grid:\n    learning_rate: [0.003, 0.03]\n    lora_r: [4, 8]\n  max_parallel: 2\n"
    )
    # The credentials a fleet holds, all set (a local run uses none of them). Flower's own periodic "enable
    # events" broadcast is off: the workers must send their task events by themselves.
    secrets = {name: CANARY for name in ("RUNPOD_API_KEY", "VAST_API_KEY", "HF_TOKEN", "WANDB_API_KEY")}
    env = fleet_env(home, **secrets, FLOWER_ENABLE_EVENTS="false")
    flower_log = home / "flower.log"
    with flower(env, flower_log) as url:  # first: Flower knows only the tasks whose events it saw
        assert not fleet_workers(home)
        waited = fleet_cli(env, "sweep", str(job), "--wait", "--json", timeout=600)
        assert waited.returncode == 0, waited.stderr[-3000:]
        assert "no worker serves" not in waited.stderr
        view = json.loads(waited.stdout)
        sweep_id, run_ids = view["sweep_id"], [row["run_id"] for row in view["rows"]]
        # The worker it started served the sweep (its log is in the home), and is gone with it.
        assert list((home / "logs").glob("worker-*.log")) and workers_left(home) == []

        def stages_done() -> dict[str, dict[str, Any]] | None:
            tasks = api_tasks(url)  # events arrive asynchronously: poll briefly
            done = {(t["name"], t["args"]) for t in tasks.values() if t["state"] == "SUCCESS"}
            wanted = {(name, repr([run_id])) for name in STAGE_TASKS for run_id in run_ids}
            return tasks if wanted <= done else None

        tasks = wait_until(stages_done, 15, "every run's four stage tasks SUCCESS in Flower")
    assert view["state"] == "SUCCEEDED", view
    assert fleet_json(env, "status", sweep_id) == view  # the table again, as `fleet status SWEEP` has it
    rows = view["rows"]
    assert [r["state"] for r in rows] == ["SUCCEEDED"] * 4
    assert all(isinstance(r["metric"], float) for r in rows)
    best = min(rows, key=lambda r: r["metric"])
    assert [r["best"] for r in rows] == [r is best for r in rows] and view["best"] == best["run_id"]

    # Each child was active from its first stage to its end; at no moment were more than two active (and
    # two were, at some moment: the sweep did run in parallel).
    spans = []
    for row in rows:
        times = {e["type"]: e["time"] for e in reversed(events_of(home, row["run_id"]))}
        spans.append((times["stage.started"], times["run.succeeded"]))
    edges = sorted([(start, 1) for start, _ in spans] + [(stop, -1) for _, stop in spans])
    running, most = 0, 0
    for _t, step in edges:
        running += step
        most = max(most, running)
    assert most == 2, spans

    # The first two nodes ran the readiness check; the two after them, local heads with the same
    # interpreter, packages and environment, were ready on what it found (workers.readiness).
    ready = [[e["data"] for e in events_of(home, row["run_id"]) if e["type"] == "node.ready"] for row in rows]
    assert sorted(r["remembered"] for (r,) in ready) == [False, False, True, True], ready
    assert all(r["check"]["executable"] == ready[0][0]["check"]["executable"] for (r,) in ready)

    # The table as people read it: the best run's row is marked.
    shown = fleet_cli(env, "status", sweep_id)
    assert shown.returncode == 0, shown.stderr
    marked = [line for line in shown.stdout.splitlines() if "★" in line]
    assert len(marked) == 1 and best["run_id"] in marked[0], shown.stdout

    # Flower: each stage task (polls included) carries its run id and nothing else; no credential shows.
    ours = [t for t in tasks.values() if t["name"] in STAGE_TASKS]
    # (a list as sent; a tuple once Celery re-sent the task itself: task.retry after an error that may pass)
    shown_args = {t["args"] for t in ours}
    assert shown_args <= {repr([run_id]) for run_id in run_ids} | {repr((run_id,)) for run_id in run_ids}
    assert {run_id for run_id in run_ids if {repr([run_id]), repr((run_id,))} & shown_args} == set(run_ids)
    assert all(t["kwargs"] == "{}" and t["state"] == "SUCCESS" and t["worker"] for t in ours), ours
    assert all(t["args"] == "()" for t in tasks.values() if t["name"] == REAP_TASK)  # beat's reaper: none
    assert CANARY not in json.dumps(tasks) and CANARY not in flower_log.read_text()
