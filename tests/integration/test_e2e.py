"""The tiny job end to end through the real CLI: embedded Redis, real Celery workers, a real local Ray
head, the real trainer (torch + transformers + peft under Ray Train)."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import redis

from jobs.dataset_check import MAX_ROWS
from providers.local.client import node_python
from state.keys import RUNS_INDEX, run_key
from tests.factories import EXAMPLE_YAML, copy_example_data, light_job_file
from tests.integration.fleetproc import (
    REPO,
    Worker,
    events_of,
    fleet,
    fleet_env,
    fleet_json,
    fleet_workers,
    ledger_of,
    live_heads,
    secret_hits,
    wait_for_end,
    wait_until,
    workers_left,
)
from trainer.config import TrainJob

pytestmark = pytest.mark.integration
STAGES = ["provision", "prepare", "train", "finalize"]


def light_job(home: Path) -> Path:
    """The example job trained in one process (`use_ray: false`), for tests about the orchestration (a
    killed worker), which need a job that trains but not Ray Train's start-up each time."""
    job = home.parent / "light" / "tiny.yml"
    job.parent.mkdir(exist_ok=True)
    job.write_text(EXAMPLE_YAML.read_text().replace("use_ray: true", "use_ray: false"))
    if not (job.parent / "data").exists():
        copy_example_data(job.parent)
    return job


def wait_for_training(home: Path, run_id: str) -> None:
    """Until the trainer reported a step; fails at once if the run ended before that."""

    def check() -> bool:
        kinds = [e["type"] for e in events_of(home, run_id)]
        assert not {"run.failed", "run.cancelled", "run.succeeded"} & set(kinds), events_of(home, run_id)[-3:]
        return "train.step" in kinds

    wait_until(check, 300, "the first training step")


def test_fleet_run_tiny_lora_end_to_end(home: Path) -> None:
    env = fleet_env(home)
    done = fleet(env, "run", str(EXAMPLE_YAML), "--json", timeout=420)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    view = json.loads(done.stdout)
    assert view["state"] == "SUCCEEDED"

    # status --json lists the run, newest first, with its four timed stages and its losses.
    (listed,) = fleet_json(env, "status")
    assert listed["run_id"] == view["run_id"] and listed["state"] == "SUCCEEDED"
    assert [s["name"] for s in listed["stages"]] == STAGES
    for stage in listed["stages"]:
        assert (
            stage["started"] is not None and stage["ended"] is not None and stage["ended"] >= stage["started"]
        )
    metrics = listed["metrics"]
    assert metrics["eval_loss"] < metrics["eval_loss_first"]

    # The adapter loads onto the tiny base model with peft; the card names the hub id, not a path.
    out = Path(listed["output_dir"])
    assert (out / "adapter_model.safetensors").exists() and (out / "README.md").exists()
    from huggingface_hub import ModelCard
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.tiny import resolve_model

    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == "trainfleet/tiny-llama" and card.data.library_name == "peft"
    base = AutoModelForCausalLM.from_pretrained(resolve_model("trainfleet/tiny-llama", home / "cache"))
    model = PeftModel.from_pretrained(base, out)
    assert any("lora_" in name for name, _ in model.named_parameters())

    # logs: the run's events in stage order, ending with the success.
    logs = fleet(env, "logs", view["run_id"])
    assert logs.returncode == 0
    lines = logs.stdout.splitlines()
    started = [line.split("stage=")[1].split()[0] for line in lines if "stage.started" in line]
    assert started == STAGES
    assert "run.succeeded" in lines[-1]
    kinds = [e["type"] for e in events_of(home, view["run_id"])]
    assert kinds.count("instance.requested") == 1 and "instance.terminated" in kinds
    assert kinds.index("train.step") < kinds.index("train.finished") < kinds.index("run.succeeded")
    # The local node ran in the node environment, not the fleet's venv, and is no CPU stand-in: it is real.
    evs = events_of(home, view["run_id"])
    (ready,) = [e["data"]["check"] for e in evs if e["type"] == "node.ready"]
    (started,) = [e["data"] for e in evs if e["type"] == "train.started"]
    node_bin = node_python().parent  # its bin/python or bin/python3.11, not the fleet's
    assert Path(started["python"]).parent == Path(ready["executable"]).parent == node_bin
    assert node_bin != Path(sys.executable).parent
    assert not ready["cpu_standin"] and ready["gpus"] == 0
    assert live_heads(home) == []

    # logs --node: what each of its Ray jobs printed on the node, the trainer's steps too, its node gone.
    node_logs = fleet(env, "logs", view["run_id"], "--node")
    assert node_logs.returncode == 0, node_logs.stderr[-2000:]
    headers = [line for line in node_logs.stdout.splitlines() if line.startswith("==> ")]
    # (its results come back in a `pack` job: a sandboxed local node shares none of the fleet's files)
    jobs = [f"==> {view['run_id']}-1-{what} <==" for what in ("check", "fetch", "train", "pack")]
    assert headers == jobs, headers
    train_part = node_logs.stdout.split(jobs[2])[1].split(jobs[3])[0]
    assert sum('"kind":"step"' in line for line in train_part.splitlines()) == kinds.count("train.step")


def test_cancel_during_training_stops_job_and_node(home: Path, tmp_path: Path) -> None:
    # The tiny job for 30 epochs, not 2: on a busy machine the cancel may take longer than 2 epochs do.
    long_job = tmp_path / "job" / "tiny-long.yml"
    shutil.copytree(EXAMPLE_YAML.parent / "data", long_job.parent / "data")
    text = EXAMPLE_YAML.read_text(encoding="utf-8")
    long_job.write_text(text.replace("num_epochs: 2\n", "num_epochs: 30\n"), encoding="utf-8")
    env = fleet_env(home)
    worker = Worker(env, home / "worker.log")
    try:
        (queued,) = fleet_json(env, "enqueue", str(long_job))
        run_id = queued["run_id"]
        wait_for_training(home, run_id)
        (node,) = live_heads(home)
        token = (home / "nodes" / node / "token").read_text().strip()
        view = fleet_json(env, "cancel", run_id, timeout=180)
        assert view["state"] == "CANCELLED"
        assert view["failure_reason"] == "CANCELLED_BY_USER"
        kinds = [e["type"] for e in events_of(home, run_id)]
        assert "train.finished" not in kinds and "instance.terminated" in kinds
        assert kinds[-1] == "run.cancelled"
        assert live_heads(home) == []
        # The node's token never reached the ledger, the events, the queues or any log.
        assert secret_hits(home, token) == []
    finally:
        worker.stop()


KILL_POINTS = ("instance.requested", "prepare.submitted", "train.step")


def test_worker_killed_mid_stage_recovers_without_duplicates(home: Path) -> None:
    """One run, its worker killed -9 three times: in provision (after the instance was asked for), in
    prepare (after its Ray job was submitted) and in train (after a step). Each time a new worker picks the
    run up; it ends SUCCEEDED with one node, each stage's work done once and each step relayed once."""
    env = fleet_env(home)
    worker = Worker(env, home / "worker-0.log")
    try:
        (queued,) = fleet_json(env, "enqueue", str(light_job(home)))
        run_id = queued["run_id"]
        for n, kill_after in enumerate(KILL_POINTS, start=1):

            def reached(kind: str = kill_after) -> bool:
                return kind in [e["type"] for e in events_of(home, run_id)]

            wait_until(reached, 300, kill_after, every=0.2)
            worker.kill(signal.SIGKILL)  # main process and pool children at once, mid-stage
            worker = Worker(env, home / f"worker-{n}.log")
        view = wait_for_end(env, run_id)
        assert view["state"] == "SUCCEEDED", view
        evs = events_of(home, run_id)
        ids = [e["id"] for e in evs]
        assert len(ids) == len(set(ids))
        kinds = [e["type"] for e in evs]
        assert kinds.count("instance.requested") == 1  # one node for the run, never a second
        for once in ("prepare.submitted", "train.submitted", "train.finished", "run.succeeded"):
            assert kinds.count(once) == 1, once
        steps = [e["data"]["step"] for e in evs if e["type"] == "train.step"]
        assert steps == sorted(set(steps))  # each step relayed once, in order
        assert live_heads(home) == []
    finally:
        worker.stop()


def test_a_failing_job_ends_failed_with_its_reason_and_gives_the_node_back(
    home: Path, tmp_path: Path
) -> None:
    """The dataset passes submit-time checks (validate reads its first rows only: jobs.dataset_check) but a
    later row is not JSON: the node's fetch job fails."""
    data = tmp_path / "job" / "data"
    data.mkdir(parents=True)
    good = '{"instruction": "hi", "output": "ok"}\n' * (MAX_ROWS + 1)  # validate stops after MAX_ROWS
    (data / "broken.jsonl").write_text(good + "not json at all\n")
    job = tmp_path / "job" / "broken.yml"
    job.write_text(EXAMPLE_YAML.read_text().replace("data/tiny-alpaca.jsonl", "data/broken.jsonl"))
    env = fleet_env(home)
    done = fleet(env, "run", str(job), "--json", timeout=300)
    assert done.returncode == 1
    view = json.loads(done.stdout)
    assert view["state"] == "FAILED" and view["failure_reason"] == "PREPARE_FAILED"
    assert f"broken.jsonl:{MAX_ROWS + 2}: not valid JSON" in view["failure_message"]
    kinds = [e["type"] for e in events_of(home, view["run_id"])]
    assert "instance.terminated" in kinds and kinds[-1] == "run.failed" and "train.submitted" not in kinds
    assert live_heads(home) == []


def test_workers_ray_cannot_place_say_so_and_fail_resources_unavailable(home: Path, tmp_path: Path) -> None:
    """Each worker asks for a resource no node has (no check before renting can know a node's custom
    resources): the trainer reports train.pending with the demand, gives up after the fleet's bound
    (FLEET_TRAIN_PENDING_S), and the run fails RESOURCES_UNAVAILABLE, its node given back."""
    job = tmp_path / "job" / "tiny.yml"
    job.parent.mkdir()
    job.write_text(EXAMPLE_YAML.read_text().replace("  CPU: 1\n", "  CPU: 1\n  absent_thing: 1\n"))
    copy_example_data(job.parent)
    done = fleet(fleet_env(home, FLEET_TRAIN_PENDING_S="3"), "run", str(job), "--json", timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    view = json.loads(done.stdout)
    assert view["state"] == "FAILED" and view["failure_reason"] == "RESOURCES_UNAVAILABLE", view
    assert (
        view["failure_message"].startswith("Ray could not place the training workers in 3")
        and "2 x {CPU: 1, absent_thing: 1} asked, no node of the cluster is big enough"
        in view["failure_message"]
    )
    evs = events_of(home, view["run_id"])
    pending = [e["data"] for e in evs if e["type"] == "train.pending"]
    assert pending and pending[0]["demand"] == "2 x {CPU: 1, absent_thing: 1}" and pending[-1]["gave_up"]
    kinds = [e["type"] for e in evs]
    assert "train.started" not in kinds and "train.restarted" not in kinds
    assert "instance.terminated" in kinds and kinds[-1] == "run.failed"
    assert live_heads(home) == []


def test_a_nan_is_rolled_back_and_a_killed_trainer_resumes_from_its_checkpoint(
    home: Path, tmp_path: Path
) -> None:
    """Two faults in one run. kill -9 of the trainer on the node after its first checkpoint: the train stage
    runs it again, and it goes on from that checkpoint's step, not from step 0. A NaN loss at step 30 (the
    fleet's drill setting fault_injection; a job file cannot set FLEET_INJECT): the watchdog rolls back to
    the last checkpoint with half the learning rate and goes on. The run ends SUCCEEDED, and its events say
    all of it."""
    job = tmp_path / "job" / "tiny.yml"
    job.parent.mkdir()
    text = EXAMPLE_YAML.read_text().replace("save_steps: 40", "save_steps: 10")
    job.write_text(text)
    copy_example_data(job.parent)
    env = {**fleet_env(home), "FLEET_FAULT_INJECTION": "nan_at_step:30"}
    worker = Worker(env, home / "worker.log")
    try:
        (queued,) = fleet_json(env, "enqueue", str(job))
        run_id = queued["run_id"]

        def checkpointed() -> int | None:
            steps = [e["data"]["step"] for e in events_of(home, run_id) if e["type"] == "train.checkpoint"]
            return steps[0] if steps else None

        saved = wait_until(checkpointed, 300, "the first checkpoint", every=0.2)
        (driver,) = wait_until(lambda: trainer_drivers(run_id), 30, "the trainer's process")
        driver.kill()
        view = wait_for_end(env, run_id)
        assert view["state"] == "SUCCEEDED", view
        evs = events_of(home, run_id)
        (restarted,) = [e["data"] for e in evs if e["type"] == "train.restarted"]
        (resumed,) = [e["data"] for e in evs if e["type"] == "train.resumed"]
        assert restarted["restart"] == 1 and resumed["step"] >= saved  # from a checkpoint, not from 0
        assert view["metrics"]["global_step"] == view["metrics"]["total_steps"] == 90
        submitted = [e["data"]["ray_job"] for e in evs if e["type"] == "train.submitted"]
        assert submitted == [f"{run_id}-1-train", f"{run_id}-1-train-r1"]
        rollbacks = [i for i, e in enumerate(evs) if e["type"] == "train.rollback"]
        assert rollbacks and all(evs[i]["data"]["reason"] == "non_finite" for i in rollbacks)
        assert all(evs[i]["data"]["step"] == 30 and evs[i]["data"]["to_step"] < 30 for i in rollbacks)
        # The learning rate after it is about half what it was at step 25 (before the NaN), and the steps
        # replayed after it are logged with that lower rate.
        rolled = rollbacks[-1]
        (lr_before,) = [e["data"]["learning_rate"] for e in evs[:rolled] if e["type"] == "train.step"][-1:]
        (lr_after,) = [e["data"]["learning_rate"] for e in evs[rolled:] if e["type"] == "train.step"][:1]
        assert evs[rolled]["data"]["learning_rate"] < 0.75 * lr_before and lr_after < 0.75 * lr_before
        assert live_heads(home) == []
    finally:
        worker.stop()


def test_a_trainer_told_to_stop_on_a_machine_that_stays_goes_on_from_its_step(
    home: Path, tmp_path: Path
) -> None:
    """SIGTERM to a local run's trainer (one process: `use_ray: false`), as a container's stop reaches it:
    it keeps a checkpoint at the step it reached (the job schedules none), says `train.stopped`, and, its
    machine staying, ends itself a while later. The train stage waits FLEET_STOPPED_NODE_WAIT_S for the
    machine to go, then runs the job again on it, which goes on from that step."""
    job = light_job_file(tmp_path / "job")
    job.write_text(job.read_text().replace("save_steps: 40", "save_steps: 1000"))
    env = {**fleet_env(home), "FLEET_STOPPED_NODE_WAIT_S": "1"}
    worker = Worker(env, home / "worker.log")
    try:
        (queued,) = fleet_json(env, "enqueue", str(job))
        run_id = queued["run_id"]

        def reached() -> int:
            steps = [e["data"]["step"] for e in events_of(home, run_id) if e["type"] == "train.step"]
            return max(steps, default=0)

        wait_until(lambda: reached() >= 15, 300, "step 15", every=0.2)
        (driver,) = wait_until(lambda: trainer_drivers(run_id), 30, "the trainer's process")
        driver.send_signal(signal.SIGTERM)
        view = wait_for_end(env, run_id)
        assert view["state"] == "SUCCEEDED", view
        evs = events_of(home, run_id)
        kinds = [e["type"] for e in evs]
        (stopped,) = [e["data"] for e in evs if e["type"] == "train.stopped"]
        (restarted,) = [e["data"] for e in evs if e["type"] == "train.restarted"]
        (resumed,) = [e["data"] for e in evs if e["type"] == "train.resumed"]
        assert stopped["why"] == "SIGTERM" and stopped["step"] >= 15 and stopped["saved_in_s"] >= 0
        assert kinds.index("train.stopped") < kinds.index("train.restarted") and restarted["restart"] == 1
        assert resumed["step"] == stopped["step"]  # the step it was told at: no other checkpoint was kept
        assert "run.preempted" not in kinds and live_heads(home) == []
    finally:
        worker.stop()


def trainer_drivers(run_id: str) -> list[psutil.Process]:
    """The `python -m trainer train` process of this run (the Ray job's driver on the local head)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd[1:4] != ["-m", "trainer", "train"] or not cmd[0].endswith(("python", "python3")):
            continue
        try:
            raw = proc.environ().get("FLEET_TRAIN_JOB", "")  # base64: what Ray passes on is not expanded
            if raw and TrainJob.from_env(raw).run_id == run_id:
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
    return found


def test_a_signal_in_fleet_runs_first_moments_leaves_no_worker_and_no_run_going(home: Path) -> None:
    """SIGTERM while `fleet run` is still starting its worker and submitting (CI of 2618414: a signal that
    came before the handler was in place ended the command by the default action, and its worker ran the
    run to its end alone): it leaves at once (nothing queued yet) or cancels what it queued; either way no
    worker is left and no run goes on."""
    env = fleet_env(home)
    argv = [sys.executable, "-m", "fleet", "run", str(light_job(home)), "--json"]
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(lambda: fleet_workers(home), 60, "the worker `fleet run` starts")
        proc.send_signal(signal.SIGTERM)  # the worker is starting: seconds before the run's first stage
        _stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        left = workers_left(home)
        for worker in left:  # (a failure here must not leave them serving the home)
            worker.kill()
    assert proc.returncode in (1, 130), stderr[-3000:]  # cancelled and followed to its end, or left at once
    assert left == []
    client = ledger_of(env)
    runs = [json.loads(client.get(run_key(r)) or "{}") for r in client.zrange(RUNS_INDEX, 0, -1)]
    assert all(r["state"] in ("CANCELLED", "QUEUED") for r in runs), runs  # none trains on without it
    assert live_heads(home) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_fleet_run_ended_by_a_signal_cancels_its_run_and_leaves_no_worker(home: Path, sig: int) -> None:
    """`timeout 900 fleet run ...` (SIGTERM) or a closed terminal (SIGHUP): the run is cancelled and its node
    ended as with Ctrl-C, and the worker `fleet run` started stops with it instead of running on alone."""
    env = fleet_env(home)
    argv = [sys.executable, "-m", "fleet", "run", str(light_job(home)), "--json"]
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:

        def started() -> str | None:
            with contextlib.suppress(OSError, redis.RedisError):
                for run_id in ledger_of(env).zrange(RUNS_INDEX, 0, -1):
                    if "stage.started" in [e["type"] for e in events_of(home, run_id)]:
                        return str(run_id)
            return None

        run_id = wait_until(started, 120, "the run's first stage")
        assert fleet_workers(home), "fleet run started no worker"
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    view = json.loads(stdout)
    assert view["run_id"] == run_id and view["state"] == "CANCELLED", view
    assert f"{signal.Signals(sig).name}: cancelling the run" in stderr
    assert workers_left(home) == []  # stopped with it, not left serving the home with PPID 1
    assert live_heads(home) == []
