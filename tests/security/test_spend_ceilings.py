"""Issue 39, item 3: the spending caps hold while runs run, not only at submit.

A run's worst case (its nodes' GPUs x max_bid_per_gpu x terminate_after: state.worstcase) is checked at
submit against the per-run cap, the fleet's day cap and the submitter's, with what was spent in the last
24 h and what the runs not ended may still cost; a sweep's children, `fleet enqueue`'s files and a commit's
configs all together. It is checked again as a run leaves the queue, and the reaper stops a run that still
spends once its submitter's day cap is spent, its checkpoint brought back from the node first. Before, each
cap compared money already spent, once per batch: a sweep of 256 runs at $100/GPU-h, or a commit of 60
configs, was queued whole under a $1 day cap.

The jobs here rent the fake RunPod's RTX A5000 (tests.factories.RUNPOD_SECTION): 1 GPU at max_bid_per_gpu
$0.50 for terminate_after's 24 h, a worst case of $12 each.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from core.errors import FailureReason, OverBudget
from fleet.cli import cli
from jobs.spec import load_job
from providers.registry import FleetSettings
from providers.runpod.section import RunPodSection
from providers.world import World
from service import runs
from service.gitrepo import GitRepo
from service.gitwatch import Outcome, Trigger, look
from state.keys import RUNS_INDEX, SWEEPS_INDEX
from state.ledger import Ledger
from state.models import Instance, InstanceState
from state.payloads import GitOrigin
from state.stages import RunState, Stage
from tests.factories import LOCAL_SECTION, RUNPOD_SECTION, ledger_run, light_job_file
from tests.fakes import FakeRunPod
from tests.fakes.replay import OUTPUT_FILES
from tests.faults.case import Case
from tests.faults.direct import DirectFleet
from tests.integration.fleetproc import NOWHERE
from tests.integration.test_git_trigger import Repo
from workers import context
from workers.stages.reap import reap_once

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KEY = "rpa_spendceilings0123456789abcdefghij"  # a RunPod key for the submit checks (never sent anywhere)
SWEEP = "sweep:\n  grid: {learning_rate: [0.001, 0.002, 0.003, 0.004], lora_r: [4, 8, 16, 32]}\n"
# The sweep child: 8 pods of 16 H100s at $100 a GPU-hour, for terminate_after's default day.
H100S = (
    "runpod:\n  gpu: NVIDIA H100 80GB HBM3\n  gpu_count: 16\n  max_bid_per_gpu: 100\n  num_nodes: 8\n"
    "  network_volume_id: vol-1\n  one_shot: true\n"
)


@pytest.fixture
def env(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> dict[str, str]:
    """A fleet CLI's environment on the session's Redis (emptied), RunPod's key and no RunPod to reach."""
    settings = fleet_home / "settings.yml"
    settings.write_text("{}\n")
    return {
        "REDIS_URL": redis_url,
        "FLEET_HOME": str(fleet_home),
        "FLEET_SETTINGS_FILE": str(settings),
        "FLEET_SECRETS_FILE": str(fleet_home / "no-secrets.yml"),
        "RUNPOD_API_KEY": KEY,
        "RUNPOD_API_BASE_URL": NOWHERE,
    }


def queued(client: redis.Redis[str]) -> tuple[int, int, int]:
    """Runs in the ledger, sweeps in the ledger, provision tasks sent."""
    return client.zcard(RUNS_INDEX), client.zcard(SWEEPS_INDEX), client.llen(Stage.PROVISION.value)


def test_a_sweep_that_together_passes_the_day_cap_is_refused_whole(
    env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    job = light_job_file(tmp_path / "job", RUNPOD_SECTION, extra=SWEEP)  # 16 children, $12 each
    refused = CliRunner().invoke(cli, ["sweep", str(job)], env={**env, "FLEET_MAX_DOLLARS_PER_DAY": "191"})
    assert isinstance(refused.exception, OverBudget), refused.output
    said = str(refused.exception)
    assert "these 16 runs may cost $192.00 together" in said, said
    assert "the cap of $191.00 a day on the fleet's nodes (FLEET_MAX_DOLLARS_PER_DAY)" in said, said
    assert queued(redis_client) == (0, 0, 0)  # not one child, not the sweep

    whole = CliRunner().invoke(cli, ["sweep", str(job)], env={**env, "FLEET_MAX_DOLLARS_PER_DAY": "192"})
    assert whole.exit_code == 0, whole.output
    assert queued(redis_client)[:2] == (16, 1)


def test_a_batch_of_enqueued_files_is_refused_whole_and_counts_the_runs_not_ended(
    env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    files = [str(light_job_file(tmp_path / name, RUNPOD_SECTION)) for name in "abc"]
    capped = {**env, "FLEET_MAX_DOLLARS_PER_DAY": "30"}
    refused = CliRunner().invoke(cli, ["enqueue", *files], env=capped)
    assert isinstance(refused.exception, OverBudget), refused.output
    assert "these 3 runs may cost $36.00 together" in str(refused.exception)
    assert queued(redis_client) == (0, 0, 0)

    two = CliRunner().invoke(cli, ["enqueue", *files[:2]], env=capped)
    assert two.exit_code == 0, two.output
    assert queued(redis_client) == (2, 0, 2)
    # Nothing is spent yet, but the two queued runs may still cost $24: the third does not fit beside them.
    third = CliRunner().invoke(cli, ["enqueue", files[2]], env=capped)
    assert isinstance(third.exception, OverBudget), third.output
    assert "with $0.00 spent in the last 24 h and up to $24.00 more for the runs not ended" in str(
        third.exception
    )
    assert queued(redis_client) == (2, 0, 2)


def test_a_commits_configs_are_refused_whole_by_the_repositorys_cap(
    redis_client: redis.Redis[str], redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_SECRETS_FILE", str(tmp_path / "missing.yml"))
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    home = tmp_path / "home"
    home.mkdir()
    settings = FleetSettings(
        redis_url=redis_url, home=home, runpod_api_base_url=NOWHERE, git_dollars_per_day=35
    )
    repo = Repo(tmp_path / "repo")
    fleet = runs.Fleet.connect(World.of(settings))
    trigger = Trigger(fleet, GitRepo.open(repo.root), "acme/configs", ["tasks/*.yml"])
    look(trigger, "main", repo.git("rev-parse", "HEAD"))  # the first look: from here on
    for seed, name in enumerate(("a.yml", "b.yml", "c.yml")):
        repo.write(name, seed, repo.template.replace(LOCAL_SECTION, RUNPOD_SECTION))
    sha = repo.commit("three rented runs: $36 at worst")

    refused = look(trigger, "main", sha).results
    assert [r.outcome for r in refused] == [Outcome.REFUSED] * 3, refused
    assert all("(FLEET_GIT_DOLLARS_PER_DAY)" in r.message for r in refused), refused[0].message
    assert "these 3 runs may cost $36.00 together" in refused[0].message
    assert redis_client.zcard(RUNS_INDEX) == 0

    raised_fleet = runs.Fleet.connect(World.of(settings.model_copy(update={"git_dollars_per_day": 36.0})))
    raised = Trigger(raised_fleet, trigger.repo, "acme/configs", ["tasks/*.yml"])
    enqueued = look(raised, "main", sha).results
    assert [(r.outcome, r.run_id) for r in enqueued] == [(Outcome.ENQUEUED, r.run_id) for r in refused]
    fleet.redis.close()
    raised_fleet.redis.close()


def ended_node(run_id: str, price_per_hour: float) -> Instance:
    """A node of `run_id` that was up for the last hour at `price_per_hour` and has just ended."""
    now = time.time()
    node = Instance(name=f"tf-{run_id}-1", provider="runpod", run_id=run_id, price_per_hour=price_per_hour)
    ended = {"created_at": now - 3600, "updated_at": now, "state": InstanceState.TERMINATED}
    return node.model_copy(update=ended)


def proxied(fake: FakeRunPod) -> dict[str, Any]:
    """The settings that reach the fake's pods through its HTTPS proxy, as RunPod's are reached."""
    return {name.removeprefix("FLEET_").lower(): value for name, value in fake.proxy.settings().items()}


@pytest.mark.parametrize("change", ["cap lowered", "money spent since"])
def test_a_queued_run_that_no_longer_fits_is_not_started(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    fake = case.cloud(FakeRunPod, tmp_path / "fake", nodes="stub")
    direct = DirectFleet(
        case, redis_url, tmp_path / "fleet", [fake], monkeypatch, max_dollars_per_day=20.0, **proxied(fake)
    )
    run_id = direct.submit(light_job_file(tmp_path / "job", RUNPOD_SECTION))  # $12 under $20: queued
    case.expect(run_id, RunState.FAILED)
    if change == "cap lowered":  # the operator lowered the day cap; the workers run with it now
        context.init(direct.settings.model_copy(update={"max_dollars_per_day": 10.0}), redis_url)
    else:  # another run's node cost $9 since: $9 spent + $12 > $20
        direct.ctx.ledger.put_instance(ended_node("other", price_per_hour=9.0))

    direct.drive(run_id, until=lambda r: False)

    run = direct.ctx.ledger.get_run(run_id)
    message = run.failure_message or ""
    assert (run.state, run.failure_reason) == (RunState.FAILED, FailureReason.OVER_BUDGET), message
    assert message.startswith("not started: ") and "(FLEET_MAX_DOLLARS_PER_DAY)" in message, message
    assert run.instance is None and direct.ctx.ledger.get_instance(f"tf-{run_id}-1") is None
    assert fake.state()["most_live"] == {}  # no pod was ever created
    case.check()


def test_the_reaper_stops_a_run_whose_submitters_day_cap_is_spent_keeping_its_checkpoint(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = case.cloud(FakeRunPod, tmp_path / "fake", nodes="replay")
    fake.nodes.replayer.train_s = 60.0  # type: ignore[attr-defined]  # still training when the cap is spent
    direct = DirectFleet(
        case, redis_url, tmp_path / "fleet", [fake], monkeypatch, git_dollars_per_day=20.0, **proxied(fake)
    )
    origin = GitOrigin(repo="example.com/acme/configs", commit="a" * 40, path="tasks/tiny.yml")
    job = load_job(light_job_file(tmp_path / "job", RUNPOD_SECTION))
    run_id = runs.submit(direct.fleet, job, origin=origin).run_id  # $12 under the repository's $20
    case.expect(run_id, RunState.FAILED)
    direct.drive(run_id, until=lambda r: r.state == RunState.TRAINING and r.progress.step is not None)
    # Meanwhile another run from the same repository cost $25 in the last hour (its node has ended).
    other = ledger_run("other", RunPodSection(max_bid_per_gpu=0.5), RunState.FAILED, origin=origin)
    direct.ctx.ledger.create_run(other, [])
    direct.ctx.ledger.put_instance(ended_node("other", price_per_hour=25.0))

    report = reap_once(direct.ctx)

    assert report is not None and report.over_budget == [run_id]
    stopping = direct.ctx.ledger.get_run(run_id)
    assert stopping.state == RunState.FINALIZING and stopping.stopping is not None  # bringing its output back
    direct.drive(run_id, until=lambda r: False)
    run = direct.ctx.ledger.get_run(run_id)
    message = run.failure_message or ""
    assert (run.state, run.failure_reason) == (RunState.FAILED, FailureReason.OVER_BUDGET), message
    assert "the runs of git:example.com/acme/configs cost $25." in message, message
    assert "the cap is $20.00 a day (FLEET_GIT_DOLLARS_PER_DAY)" in message, message
    assert "checkpoints included" in message and run.progress.pulled, message
    # The node's output directory came back before the node went: the adapter and what it had saved.
    assert sorted(p.name for p in Path(run.output_dir).iterdir()) == sorted(OUTPUT_FILES)
    assert fake.state()["instances"] == []
    case.check()


def test_fleet_validate_plan_shows_the_worst_case(env: dict[str, str], tmp_path: Path) -> None:
    small = light_job_file(tmp_path / "small", RUNPOD_SECTION)
    big = light_job_file(tmp_path / "big", H100S)
    big.write_text(big.read_text().replace("use_ray: false", "use_ray: true"))
    shown = CliRunner().invoke(cli, ["validate", "--plan", str(small), str(big)], env=env)
    assert shown.exit_code == 0, shown.output
    lines = [line.strip() for line in shown.output.splitlines() if line.strip().startswith("worst:")]
    assert lines[0] == (
        "worst:    $12.00: 1 node x 1 GPU x $0.50/GPU/h (max_bid_per_gpu) x 24 h (terminate_after); within "
        "the cap of $50.00 a run"
    )
    assert lines[1].startswith(
        "worst:    $307,200.00: 8 nodes x 16 GPUs x $100.00/GPU/h (max_bid_per_gpu) x 24 h"
    )
    assert "over the cap of $50.00 a run (FLEET_MAX_DOLLARS_PER_RUN), so refused at submit" in lines[1]
    as_json = CliRunner().invoke(cli, ["validate", "--plan", "--json", str(small)], env=env)
    (plan,) = json.loads(as_json.stdout)
    assert plan["worst_case_usd"] == 12.0 and "terminate_after" in plan["worst_case_note"]


def test_a_run_whose_worst_case_passes_the_per_run_cap_is_refused_at_submit(
    env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    """The default per-run cap ($50) holds with no day cap set: the issue's 8 x 16 H100 child is refused."""
    big = light_job_file(tmp_path / "big", H100S)
    big.write_text(big.read_text().replace("use_ray: false", "use_ray: true"))
    refused = CliRunner().invoke(cli, ["enqueue", str(big)], env=env)
    assert isinstance(refused.exception, OverBudget), refused.output
    assert "may cost up to $307,200.00" in str(refused.exception)
    assert "the cap is $50.00 a run (FLEET_MAX_DOLLARS_PER_RUN)" in str(refused.exception)
    assert queued(redis_client) == (0, 0, 0)


def test_a_pool_job_s_worst_case_counts_its_machines_hourly_price(
    env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    """A pool machine has no bid: the dearest that fits bounds the run's hours; the run keeps the bound."""
    pools = tmp_path / "pools.yml"
    pools.write_text(
        "pools:\n  lab:\n    user: me\n    key: /k\n    machines:\n"
        "      - {host: box, gpus: 1, gpu: L40S, hourly_usd: 5.0}\n"
    )
    at_home = {**env, "FLEET_SSH_POOLS_FILE": str(pools)}
    job = light_job_file(tmp_path / "pool", "ssh:\n  pool: lab\n")
    refused = CliRunner().invoke(cli, ["enqueue", str(job)], env=at_home)
    assert isinstance(refused.exception, OverBudget), refused.output
    assert "may cost up to $120.00" in str(refused.exception)  # $5/h for terminate_after's 24 h
    assert queued(redis_client) == (0, 0, 0)
    pools.write_text(pools.read_text().replace("5.0", "0.5"))
    taken = CliRunner().invoke(cli, ["enqueue", "--json", str(job)], env=at_home)
    assert taken.exit_code == 0, taken.output
    (run_id,) = [r["run_id"] for r in json.loads(taken.stdout)]
    assert Ledger(redis_client).get_run(run_id).ceiling_per_hour == 0.5  # what admission checks again
