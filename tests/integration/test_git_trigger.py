"""The git-commit trigger against real git repositories and a real Redis: `fleet watch` and
`fleet enqueue --changed-since` enqueue each (commit, path) exactly once. No worker runs: runs stay QUEUED."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from core.policy_settings import Source
from core.settings import Settings
from fleet.cli import cli
from providers.world import World
from service.gitrepo import GitRepo
from service.gitwatch import Outcome, Start, Trigger, look
from service.runs import Fleet
from state.keys import GIT_INVALID, RUNS_INDEX, git_claim_key, git_lease_key, git_watermark_key
from state.ledger import Ledger
from state.payloads import GitOrigin
from tests.factories import GitWorkTree, light_job_file
from tests.integration.fleetproc import fleet, fleet_env, redis_of


class Repo(GitWorkTree):
    """A git repository in a temporary folder with a job template (its dataset linked beside it)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.template = light_job_file(root / "tasks").read_text()  # tasks/tiny.yml + the tasks/data link
        self.commit("initial")

    def write(self, name: str, seed: int, text: str | None = None) -> None:
        (self.root / "tasks" / name).write_text(text or self.template.replace("seed: 42", f"seed: {seed}"))


def _queued(client: redis.Redis[str]) -> dict[tuple[str, str], str]:
    """(commit, path) -> run id for every run in the ledger (each must be QUEUED and come from git)."""
    found = {}
    for run in Ledger(client).list_runs(100):
        assert run.state.value == "QUEUED" and run.origin is not None and run.origin.kind == "git", run
        key = (run.origin.commit, run.origin.path)
        assert key not in found, f"two runs for {key}"
        found[key] = run.run_id
    return found


def test_one_commit_with_two_configs_enqueues_two_runs_once(home: Path, tmp_path: Path) -> None:
    """The must-show: two configs in one commit -> two runs; again -> none; one modified -> one more.
    The first three looks are `fleet` processes (about a second each); the last one runs in-process."""
    repo = Repo(tmp_path / "repo")
    env = fleet_env(home, FLEET_LOCAL_JOBS_FROM="cli,git")
    first = fleet(env, "watch", str(repo.root), "--once")
    assert first.returncode == 0, first.stderr
    assert f"from {repo.git('rev-parse', 'HEAD')}" in first.stderr  # nothing before the first look
    repo.write("a.yml", 1)
    repo.write("b.yml", 2)
    (repo.root / "notes.md").write_text("not a config\n")
    two = repo.commit("two configs")
    looked = fleet(env, "watch", str(repo.root), "--once", "--json")
    assert looked.returncode == 0, looked.stderr
    client = redis_of(home)
    assert set(_queued(client)) == {(two, "tasks/a.yml"), (two, "tasks/b.yml")}
    lines = [json.loads(line) for line in looked.stdout.splitlines()]
    assert [x["event"] for x in lines] == ["enqueued", "enqueued", "look"] and lines[-1]["enqueued"] == 2

    again = fleet(env, "watch", str(repo.root), "--once")
    assert again.returncode == 0 and again.stdout == "", again.stderr
    assert client.zcard(RUNS_INDEX) == 2
    initial = repo.git("rev-parse", "HEAD~1")  # a watcher told to start earlier walks the commit again:
    rewalk = CliRunner().invoke(cli, ["watch", str(repo.root), "--once", "--since", initial], env=env)
    assert rewalk.exit_code == 0 and rewalk.output.count("already enqueued") == 2, rewalk.output
    assert client.zcard(RUNS_INDEX) == 2

    repo.write("a.yml", 3)
    three = repo.commit("retune a")
    assert CliRunner().invoke(cli, ["watch", str(repo.root), "--once"], env=env).exit_code == 0
    queued = _queued(client)
    assert set(queued) == {(two, "tasks/a.yml"), (two, "tasks/b.yml"), (three, "tasks/a.yml")}
    status = CliRunner().invoke(cli, ["status", queued[(three, "tasks/a.yml")]], env=env)
    assert f"tasks/a.yml at commit {three}" in " ".join(status.stdout.split())
    client.close()


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("FLEET_SECRETS_FILE", str(tmp_path / "missing.yml"))
    home = tmp_path / "home"
    home.mkdir()
    return Settings(redis_url=redis_url, home=home, local_jobs_from=(Source.CLI, Source.GIT))


@pytest.fixture
def env(settings: Settings, redis_url: str, redis_client: redis.Redis[str]) -> dict[str, str]:
    """The environment of the in-process CLI (on an emptied database)."""
    (settings.home / "settings.yml").write_text("local_jobs_from: cli,git\n")
    return {"REDIS_URL": redis_url, "FLEET_HOME": str(settings.home),
            "FLEET_SETTINGS_FILE": str(settings.home / "settings.yml")}  # fmt: skip


@pytest.fixture
def connected(settings: Settings, redis_client: redis.Redis[str]) -> Iterator[Fleet]:
    running = Fleet.connect(World.of(settings))
    yield running
    running.redis.close()


def test_invalid_config_is_reported_and_marked_seen_the_valid_one_still_enqueued(
    env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    repo = Repo(tmp_path / "repo")
    runner = CliRunner()
    assert runner.invoke(cli, ["watch", str(repo.root), "--once"], env=env).exit_code == 0
    repo.write("good.yml", 1)
    bad_text = repo.template.replace("micro_batch_size: 8", "micro_batch_size: 0")
    repo.write("bad.yml", 0, bad_text)
    repo.write("sweep.yml", 2, repo.template + "sweep:\n  grid: {lora_r: [4, 8]}\n")  # never retried
    sha = repo.commit("one good, one bad")
    result = runner.invoke(cli, ["watch", str(repo.root), "--once"], env=env)
    assert result.exit_code == 1, result.output
    line = bad_text.splitlines().index("micro_batch_size: 0") + 1
    assert f"tasks/bad.yml@{sha[:7]}:{line}: micro_batch_size:" in result.output
    assert "Traceback" not in result.output
    assert set(_queued(redis_client)) == {(sha, "tasks/good.yml")}
    assert redis_client.get(git_claim_key(str(repo.root), sha, "tasks/bad.yml")) == GIT_INVALID
    assert f"tasks/sweep.yml@{sha[:7]}" in result.output and "starts single runs" in result.output
    assert redis_client.get(git_claim_key(str(repo.root), sha, "tasks/sweep.yml")) == GIT_INVALID

    again = runner.invoke(cli, ["watch", str(repo.root), "--once"], env=env)
    assert again.exit_code == 0 and "micro_batch_size" not in again.output, again.output
    assert redis_client.zcard(RUNS_INDEX) == 1


def test_racing_watchers_enqueue_each_config_once(
    connected: Fleet, settings: Settings, redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    repo = Repo(tmp_path / "repo")
    git = GitRepo.open(repo.root)
    base = repo.git("rev-parse", "HEAD")
    for i in range(3):
        repo.write(f"c{i}.yml", i)
    one = repo.commit("three configs")
    repo.write("c0.yml", 9)
    two = repo.commit("one again")
    barrier = threading.Barrier(4)

    def watcher() -> list[Outcome]:
        fleet = Fleet.connect(World.of(settings))
        try:
            barrier.wait()
            trigger = Trigger(fleet, git, "race", ["tasks/*.yml"])
            return [r.outcome for r in look(trigger, "main", two, since=base).results]
        finally:
            fleet.redis.close()

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(watcher) for _ in range(4)]
        outcomes = [o for f in futures for o in f.result(timeout=60)]
    expected = {(one, "tasks/c0.yml"), (one, "tasks/c1.yml"), (one, "tasks/c2.yml"), (two, "tasks/c0.yml")}
    assert set(_queued(redis_client)) == expected and redis_client.zcard(RUNS_INDEX) == 4
    assert outcomes.count(Outcome.ENQUEUED) == 4, outcomes


def test_a_claim_without_its_run_is_submitted_later_under_the_same_run_id(
    connected: Fleet, redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    """A process that died between claiming and submitting: its lease holds the run off until it expires,
    and the watermark stays before that commit meanwhile; then the next look submits it under that id."""
    repo = Repo(tmp_path / "repo")
    trigger = Trigger(connected, GitRepo.open(repo.root), "crash", ["tasks/**/*.yml"])
    assert look(trigger, "main", repo.git("rev-parse", "HEAD")).began == Start.FIRST
    repo.write("a.yml", 1)
    sha = repo.commit("a")
    redis_client.set(git_claim_key("crash", sha, "tasks/a.yml"), "260101-000000-dead")
    redis_client.set(git_lease_key("260101-000000-dead"), "the dead process", ex=60)

    held = look(trigger, "main", sha)
    assert [r.outcome for r in held.results] == [Outcome.IN_FLIGHT] and redis_client.zcard(RUNS_INDEX) == 0
    assert redis_client.get(git_watermark_key("crash", "main")) != sha

    redis_client.delete(git_lease_key("260101-000000-dead"))  # the lease expired
    done = look(trigger, "main", sha)
    assert [(r.outcome, r.run_id) for r in done.results] == [(Outcome.ENQUEUED, "260101-000000-dead")]
    assert _queued(redis_client) == {(sha, "tasks/a.yml"): "260101-000000-dead"}
    assert redis_client.get(git_watermark_key("crash", "main")) == sha


def test_refused_config_is_retried_at_the_next_look(
    settings: Settings, connected: Fleet, redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    repo = Repo(tmp_path / "repo")
    capped = Fleet.connect(World.of(settings.model_copy(update={"max_dollars_per_day": 0.0})))
    trigger = Trigger(capped, GitRepo.open(repo.root), "budget", ["tasks/*.yml"])
    look(trigger, "main", repo.git("rev-parse", "HEAD"))
    repo.write("a.yml", 1)
    sha = repo.commit("a")
    refused = look(trigger, "main", sha).results
    assert [r.outcome for r in refused] == [Outcome.REFUSED] and "cannot submit" in refused[0].message
    assert redis_client.zcard(RUNS_INDEX) == 0
    retried = look(Trigger(connected, trigger.repo, "budget", ["tasks/*.yml"]), "main", sha).results
    assert [(r.outcome, r.run_id) for r in retried] == [(Outcome.ENQUEUED, refused[0].run_id)]
    capped.redis.close()


def test_rewritten_branch_is_not_replayed(
    connected: Fleet, redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    repo = Repo(tmp_path / "repo")
    trigger = Trigger(connected, GitRepo.open(repo.root), "rewrite", ["tasks/*.yml"])
    look(trigger, "main", repo.git("rev-parse", "HEAD"))
    repo.write("a.yml", 1)
    seen = repo.commit("a")
    assert look(trigger, "main", seen).count(Outcome.ENQUEUED) == 1
    repo.write("a.yml", 2)
    repo.git("commit", "-q", "--amend", "-am", "a, amended")  # then force-pushed
    amended = repo.git("rev-parse", "HEAD")
    rewritten = look(trigger, "main", amended)
    assert rewritten.began == Start.REWRITTEN and rewritten.results == []
    assert redis_client.get(git_watermark_key("rewrite", "main")) == amended
    assert redis_client.zcard(RUNS_INDEX) == 1


def test_enqueue_changed_since(env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo")
    before = repo.git("rev-parse", "HEAD")
    repo.write("a.yml", 1)
    repo.commit("a")
    repo.write("b.yml", 2)
    repo.git("mv", "tasks/tiny.yml", "tasks/renamed.yml")
    head = repo.commit("b, and a rename")
    args = ["enqueue", "--changed-since", before, "--repo", str(repo.root)]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    queued = _queued(redis_client)
    assert set(queued) == {(head, "tasks/a.yml"), (head, "tasks/b.yml"), (head, "tasks/renamed.yml")}
    assert sorted(result.stdout.split()) == sorted(queued.values())
    run = Ledger(redis_client).get_run(queued[(head, "tasks/a.yml")])
    assert run.origin == GitOrigin(repo=str(repo.root), branch="main", commit=head, since=before,
                                   path="tasks/a.yml")  # fmt: skip
    assert run.source == f"tasks/a.yml@{head[:7]}"

    again = CliRunner().invoke(cli, args, env=env)
    assert again.exit_code == 0 and again.stdout == "" and redis_client.zcard(RUNS_INDEX) == 3
    zeros = CliRunner().invoke(
        cli, ["enqueue", "--changed-since", "0" * 40, "--repo", str(repo.root)], env=env
    )
    assert zeros.exit_code == 2 and "all zeros" in zeros.output
    not_git = CliRunner().invoke(cli, ["watch", str(tmp_path), "--once"], env=env)
    assert not_git.exit_code == 2 and "not in a git repository" in not_git.output
    no_branch = CliRunner().invoke(cli, ["watch", str(repo.root), "--branch", "nope", "--once"], env=env)
    assert no_branch.exit_code == 2 and "no branch 'nope'" in no_branch.output
