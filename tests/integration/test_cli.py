"""The CLI in-process (typer's runner) against a real Redis: validation and all-or-nothing enqueue."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from core.errors import FailureReason
from fleet.cli import cli
from fleet.cli_status import spark
from jobs.sections.local import LocalSection
from service import embedded
from state import nodelogs
from state.events import read_run
from state.keys import RUNS_INDEX
from state.ledger import Ledger
from state.models import Instance, RunProgress
from state.payloads import TrainEval, TrainStep
from state.stages import RunState, Stage
from tests.factories import EXAMPLE_YAML, copy_example_data, ledger_run
from tests.integration.fleetproc import fleet, fleet_env
from trainer.config import WandbPlan

BAD = Path(__file__).resolve().parents[1] / "data" / "bad"
DASH = "http://127.0.0.1:8265"


def test_validate_reports_each_file(env: dict[str, str]) -> None:
    result = CliRunner().invoke(
        cli, ["validate", str(BAD / "unknown_runpod_key.yml"), str(EXAMPLE_YAML)], env=env
    )
    assert result.exit_code == 1
    assert "unknown_runpod_key.yml:7: runpod.gpu_cuont: unknown key 'gpu_cuont'" in result.output
    assert f"ok {EXAMPLE_YAML}" in result.output
    good = CliRunner().invoke(cli, ["validate", str(EXAMPLE_YAML)], env=env)
    assert good.exit_code == 0, good.output
    # A provider that cannot network its machines together refuses a multi-node job, saying why.
    multi = CliRunner().invoke(cli, ["validate", str(BAD / "vastai_multi_node.yml")], env=env)
    assert multi.exit_code == 1
    assert (
        "vastai_multi_node.yml:6: vastai.num_nodes: vastai cannot run on 2 machines: vast.ai rents single "
        "hosts that share no private network" in " ".join(multi.output.split())
    )


def test_enqueue_is_all_or_nothing(env: dict[str, str], redis_client: redis.Redis[str]) -> None:
    result = CliRunner().invoke(cli, ["enqueue", str(EXAMPLE_YAML), str(BAD / "gpu_count_zero.yml")], env=env)
    assert result.exit_code == 1
    assert "runpod.gpu_count" in result.output and "Traceback" not in result.output
    assert redis_client.zcard(RUNS_INDEX) == 0 and redis_client.llen(Stage.PROVISION.value) == 0


def test_enqueue_queues_a_run_and_use_ray_flag(env: dict[str, str], redis_client: redis.Redis[str]) -> None:
    result = CliRunner().invoke(cli, ["enqueue", "--use-ray", str(EXAMPLE_YAML)], env=env)
    assert result.exit_code == 0, result.output
    run_id = result.stdout.strip().splitlines()[0]
    assert redis_client.zrange(RUNS_INDEX, 0, -1) == [run_id]
    assert redis_client.llen(Stage.PROVISION.value) == 1  # one provision task, carrying only the run id
    status = CliRunner().invoke(cli, ["status", run_id, "--json"], env=env)
    assert '"state": "QUEUED"' in status.stdout
    cancelled = CliRunner().invoke(cli, ["cancel", run_id, "--no-wait", "--json"], env=env)
    assert cancelled.exit_code == 0 and '"cancel_requested": true' in cancelled.stdout


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("vastai:\n  gpu_count: 1", "cannot submit: VAST_API_KEY is not set"),
        ("runpod:\n  gpu_count: 1", "cannot submit: RUNPOD_API_KEY is not set"),
    ],
)
def test_a_job_this_fleet_cannot_run_is_refused_at_submit(
    env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path, section: str, expected: str
) -> None:
    job = tmp_path / "job.yml"
    one_per_gpu = EXAMPLE_YAML.read_text().replace("ray_num_workers: 2\n", "")  # (two need two GPUs)
    job.write_text(one_per_gpu.replace("local:\n  one_shot: true", section))
    copy_example_data(tmp_path)
    env = {
        **env,
        "FLEET_SECRETS_FILE": str(tmp_path / "no-secrets.yml"),
        "RUNPOD_API_KEY": "",
        "VAST_API_KEY": "",
    }
    result = CliRunner().invoke(cli, ["enqueue", str(EXAMPLE_YAML), str(job)], env=env)
    assert result.exit_code == 1
    assert expected in result.output
    assert redis_client.zcard(RUNS_INDEX) == 0  # the valid job beside it was not queued either


def test_no_run_is_queued_over_the_fleets_daily_cap(
    env: dict[str, str], redis_client: redis.Redis[str]
) -> None:
    """FLEET_MAX_DOLLARS_PER_DAY: the fleet's nodes of the last 24 h (a live one up to now, an ended one up
    to its end, nothing before the window) at the cap: enqueue is refused with the figure, nothing queued."""
    import time

    from core.errors import OverBudget
    from state.ledger import Ledger
    from state.models import Instance, InstanceState

    now, ledger = time.time(), Ledger(redis_client)
    ledger.put_instance(
        Instance(name="tf-a-1", provider="runpod", run_id="a", price_per_hour=2.0, created_at=now - 3600)
    )
    ended = Instance(
        name="tf-b-1", provider="runpod", run_id="b", price_per_hour=1.0, created_at=now - 30 * 3600
    )
    ledger.put_instance(
        ended.model_copy(update={"state": InstanceState.TERMINATED, "updated_at": now - 22 * 3600})
    )
    capped = {**env, "FLEET_MAX_DOLLARS_PER_DAY": "4"}
    result = CliRunner().invoke(cli, ["enqueue", str(EXAMPLE_YAML), str(EXAMPLE_YAML)], env=capped)
    assert isinstance(result.exception, OverBudget)  # `fleet` itself prints it and exits 2
    assert "the fleet's nodes cost $4.00 in the last 24 h; the cap is $4.00 a day" in str(result.exception)
    assert redis_client.zcard(RUNS_INDEX) == 0 and redis_client.llen(Stage.PROVISION.value) == 0
    result = CliRunner().invoke(
        cli, ["enqueue", str(EXAMPLE_YAML)], env={**capped, "FLEET_MAX_DOLLARS_PER_DAY": "4.5"}
    )
    assert result.exit_code == 0, result.output


def test_status_shows_a_run_whole_and_the_list_its_time_and_cost(
    env: dict[str, str], redis_client: redis.Redis[str]
) -> None:
    ledger = Ledger(redis_client)
    why = "train job FAILED: " + "x" * 2500 + "\nValueError: the real cause, at the end"
    plan = WandbPlan(run_id="w1", project="p", url="https://wandb.ai/team/p/runs/w1")
    run = ledger_run(
        "261203-000000-abcdef",
        LocalSection(),
        RunState.FAILED,
        instance="tf-261203-000000-abcdef-1",
        failure_reason=FailureReason.TRAINING_FAILED,
        failure_message=why[-2000:],
        progress=RunProgress(wandb=plan),
        created_at=time.time() - 125,
    )
    ledger.create_run(run, [])
    ledger.put_instance(
        Instance(name="tf-261203-000000-abcdef-1", provider="local", run_id=run.run_id, dashboard_url=DASH)
    )
    losses = [4.0, 3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5]
    steps = [TrainStep(step=i + 1, loss=loss) for i, loss in enumerate(losses)]
    ledger.update_run(run.run_id, lambda r: [*steps, TrainEval(step=8, eval_loss=1.25)])

    shown = CliRunner().invoke(cli, ["status", run.run_id], env=env)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "ValueError: the real cause, at the end" in text  # the message whole, its end too
    assert "https://wandb.ai/team/p/runs/w1" in text and DASH in text
    assert "train loss █▇▆▅▄▃▂▁ 4 -> 0.5 (step 8, 8 points)" in text
    assert "eval loss ▁ 1.25 -> 1.25 (step 8, 1 points)" in text
    view = json.loads(CliRunner().invoke(cli, ["status", run.run_id, "--json"], env=env).stdout)
    assert view["losses"]["train"][0] == [1, 4.0] and view["losses"]["eval"] == [[8, 1.25]]
    assert view["wandb_url"] == plan.url and view["dashboard_url"] == DASH and 120 < view["duration_s"] < 200

    listed = CliRunner().invoke(cli, ["status"], env={**env, "COLUMNS": "200"})
    header = listed.output.splitlines()[1]
    assert all(name in header for name in ("time", "cost", "age")), listed.output
    assert "$0.00" in listed.output and ("2m0" in listed.output or "2m1" in listed.output), listed.output


def test_a_sparkline_keeps_its_shape_in_its_width() -> None:
    assert spark([]) == "" and spark([2.0, 2.0]) == "▁▁"
    assert spark([3.0, 2.0, 1.0]) == "█▅▁" and spark([1.0, 9.0, 1.0]) == "▁█▁"
    long = spark([float(i % 10) for i in range(480)], width=48)  # 10 teeth, averaged: flat
    assert len(long) == 48 and set(long) == {"▁"}
    spike = spark([1.0] * 200 + [50.0] * 5 + [1.0] * 200, width=40)
    assert len(spike) == 40 and spike[19:21].count("▁") < 2 and spike[:10] == "▁" * 10


def test_logs_node_prints_each_jobs_output_once_and_follows_to_the_end(
    env: dict[str, str], redis_client: redis.Redis[str]
) -> None:
    ledger = Ledger(redis_client)
    run = ledger_run("261203-000000-feed01", LocalSection(), RunState.TRAINING)
    ledger.create_run(run, [])
    nodelogs.put(redis_client, run.run_id, "r-1-fetch", "fetched tiny-llama\n")
    nodelogs.append(redis_client, run.run_id, "r-1-train", "step 1 loss 4.0\n")
    nodelogs.append(redis_client, run.run_id, "r-1-train", "step 2 loss 3.0\n")

    shown = CliRunner().invoke(cli, ["logs", run.run_id, "--node"], env=env)
    assert shown.exit_code == 0, shown.output
    assert shown.output == (
        "==> r-1-fetch <==\nfetched tiny-llama\n==> r-1-train <==\nstep 1 loss 4.0\nstep 2 loss 3.0\n"
    )

    def later() -> None:  # the trainer prints one more line, then the run ends
        time.sleep(1.5)
        nodelogs.append(redis_client, run.run_id, "r-1-train", "step 3 loss 2.0\n")
        ledger.update_run(run.run_id, lambda r: setattr(r, "state", RunState.SUCCEEDED) or [])

    threading.Thread(target=later, daemon=True).start()
    followed = CliRunner().invoke(cli, ["logs", run.run_id, "--node", "-f", "--json"], env=env)
    lines = [json.loads(line) for line in followed.stdout.splitlines()]
    assert [(x["ray_job"], x["output"]) for x in lines] == [
        ("r-1-fetch", "fetched tiny-llama\n"),
        ("r-1-train", "step 1 loss 4.0\nstep 2 loss 3.0\n"),
        ("r-1-train", "step 3 loss 2.0\n"),  # only what is new, once
    ]


def test_a_long_node_log_keeps_its_end(
    redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodelogs, "KEEP_CHARS", 100)
    for i in range(60):
        nodelogs.append(redis_client, "r", "r-1-train", f"line {i:03d}\n")  # 9 characters a line
    ((sid, text),) = nodelogs.read(redis_client, "r")
    assert sid == "r-1-train" and text.endswith("line 059\n") and len(text) <= 200
    nodelogs.put(redis_client, "r", "r-1-train", "x" * 150 + "the end\n")
    assert nodelogs.read(redis_client, "r") == [("r-1-train", "x" * 92 + "the end\n")]


def test_cancel_with_no_worker_up_ends_a_queued_run_at_once_and_does_not_wait_on_one_past_it(
    env: dict[str, str], redis_client: redis.Redis[str]
) -> None:
    queued = CliRunner().invoke(cli, ["enqueue", str(EXAMPLE_YAML)], env=env)
    run_id = queued.stdout.strip().splitlines()[0]
    started = time.monotonic()
    cancelled = CliRunner().invoke(cli, ["cancel", run_id, "--json", "--timeout", "30"], env=env)
    assert cancelled.exit_code == 0 and time.monotonic() - started < 10, cancelled.output
    view = json.loads(cancelled.stdout)
    assert view["state"] == "CANCELLED" and view["failure_reason"] == "CANCELLED_BY_USER"
    assert [e.type.value for _, e in read_run(redis_client, run_id)][-2:] == [
        "run.cancel_requested",
        "run.cancelled",
    ]

    # Past the queue (a node may be up): the cancel is recorded for a worker to finish, not waited on.
    ledger = Ledger(redis_client)
    ledger.create_run(ledger_run("261203-000000-beef02", LocalSection(), RunState.PREPARING), [])
    later = CliRunner().invoke(cli, ["cancel", "261203-000000-beef02", "--timeout", "30"], env=env)
    assert later.exit_code == 0 and "no worker serves prepare: the cancel is recorded" in later.output
    left = ledger.get_run("261203-000000-beef02")
    assert left.state == RunState.PREPARING and left.cancel_requested


def test_a_redis_that_does_not_answer_is_one_clear_line_not_a_traceback(tmp_path: Path) -> None:
    env = {**fleet_env(tmp_path / "home"), "REDIS_URL": "redis://:pw-canary-7@127.0.0.1:9/0"}  # nothing on 9
    done = fleet(env, "status", timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    said = " ".join(done.stderr.split())
    assert "the fleet's Redis at redis://:***@127.0.0.1:9/0 does not answer (Error 111 connecting to" in said
    assert "pw-canary-7" not in done.stderr + done.stdout


def test_a_read_only_command_leaves_no_redis_it_started_and_keeps_one_it_found(tmp_path: Path) -> None:
    """`fleet status` (logs, plot, instances, ...) on a home whose embedded Redis is down starts it to read
    the ledger, and stops it again on the way out; one that was up stays up, for whoever uses it."""
    home = tmp_path / "home"
    env = fleet_env(home)
    assert not embedded.running(home)
    done = fleet(env, "status", "--json", timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr[-2000:]
    assert (home / "redis" / "redis.conf").exists()  # it did start one, to read the (empty) ledger
    assert not embedded.running(home)  # and left none running
    url = embedded.ensure_redis(home)
    try:
        for args in (("status",), ("instances", "--json")):
            assert fleet(env, *args, timeout=60).returncode == 0
            assert embedded.running(home), args
    finally:
        embedded.stop_redis(home)
    assert url.startswith("unix://")


def test_version_is_the_installed_packages() -> None:
    from importlib.metadata import version

    shown = CliRunner().invoke(cli, ["--version"])
    assert shown.exit_code == 0 and shown.stdout.strip() == f"trainfleet {version('trainfleet')}"


def test_a_table_printed_into_a_pipe_keeps_its_cells_whole(
    env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    """Not a terminal and no COLUMNS: the list is as wide as its cells (a script's grep finds the whole
    source path on the run's row), not cut or wrapped at rich's 80 columns."""
    source = "/home/someone/projects/finetunes/configs/2026-12/tasks/llama-3.2-1b-lora-alpaca-sweep-07.yml"
    run = ledger_run("261203-111111-pipe01", LocalSection()).model_copy(update={"source": source})
    Ledger(redis_client).create_run(run, [])
    piped = {**fleet_env(tmp_path / "h"), **env}
    piped.pop("COLUMNS", None)
    done = fleet(piped, "status", timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [line for line in done.stdout.splitlines() if "261203-111111-pipe01" in line]
    assert source in row and len(row) > 120, done.stdout


def test_a_provider_this_fleet_does_not_run_is_refused_at_submit_with_its_line(
    env: dict[str, str], redis_client: redis.Redis[str]
) -> None:
    """docker-compose's fleet runs no local: jobs (FLEET_PROVIDERS=runpod,vastai): one is refused where its
    section was written, saying what to do instead; nothing is queued."""
    line = EXAMPLE_YAML.read_text().splitlines().index("local:") + 1
    result = CliRunner().invoke(
        cli, ["enqueue", str(EXAMPLE_YAML)], env={**env, "FLEET_PROVIDERS": "runpod,vastai"}
    )
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert (
        f"{EXAMPLE_YAML.name}:{line}: local: cannot submit: this fleet runs runpod, vastai jobs only" in said
    )
    assert "give the job a runpod: or vastai: section" in said
    assert redis_client.zcard(RUNS_INDEX) == 0 and redis_client.llen(Stage.PROVISION.value) == 0
