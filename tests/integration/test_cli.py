"""The CLI in-process (typer's runner) against a real Redis: validation and all-or-nothing enqueue."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from broker.constants import RUNS_INDEX, Stage
from fleet.cli import cli
from tests.factories import EXAMPLE_YAML, copy_example_data

BAD = Path(__file__).resolve().parents[1] / "data" / "bad"


@pytest.fixture
def env(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> dict[str, str]:
    settings = fleet_home / "settings.yml"
    settings.write_text("{}\n")
    return {"REDIS_URL": redis_url, "FLEET_HOME": str(fleet_home), "FLEET_SETTINGS_FILE": str(settings)}


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

    from broker.ledger import Ledger
    from broker.models import Instance, InstanceState
    from core.errors import OverBudget

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
