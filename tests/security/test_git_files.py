"""Issue 39, item 2: a git job's local files are the files its commit tracks, and nothing else.

A committer names the files of their job (datasets, `data_files`) in a config the git trigger reads as of
its commit. Those files come from that commit's tracked files only: never the clone's `.git` (its config
may hold the remote's credential), never an untracked, ignored or modified file of the working tree, and a
committed symlink stays a link, refused when it leads out. What the run uses is copied into the run at
submit, for a rented node and for the local one alike, so it outlives the snapshot it was read from.
Real git repositories, a real Redis, in-process looks; no worker runs.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.policy_settings import Source
from core.settings import Settings
from jobs.shipping import ship_dir
from providers.world import World
from service import gitsnapshot
from service.gitrepo import GitRepo
from service.gitwatch import ConfigResult, Outcome, Start, Trigger, look
from service.runs import Fleet
from state.ledger import Ledger
from state.models import Run
from tests.factories import TINY_DATA, GitWorkTree
from trainer import axolotl_run
from trainer.config import TrainConfig
from trainer.data import load_records
from workers import context
from workers.node_job import files_for_node, train_job

HEAD = "base_model: trainfleet/tiny-llama\n"
RUNPOD = "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n"
COMMITTED = TINY_DATA.read_bytes()
ROWS = COMMITTED.splitlines(keepends=True)


class Repo(GitWorkTree):
    """A git repository in a temporary folder: files written, committed, and changed after the commit."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.commit("initial")

    def write(self, name: str, data: bytes | str) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    def blob(self, data: bytes) -> str:
        command = ["git", "hash-object", "-w", "--stdin"]
        done = subprocess.run(command, cwd=self.root, input=data, capture_output=True, check=True)
        return done.stdout.decode().strip()

    def tree(self, *entries: str) -> str:
        """A tree made as `git mktree` is told, checked by nothing (as a pushed commit's may be)."""
        listing = "".join(f"{e}\n" for e in entries).encode()
        made = subprocess.run(
            ["git", "mktree"], cwd=self.root, input=listing, capture_output=True, check=True
        )
        return made.stdout.decode().strip()

    def committed(self, sha: str, name: str) -> bytes:
        return subprocess.run(
            ["git", "show", f"{sha}:{name}"], cwd=self.root, capture_output=True, check=True
        ).stdout


def config(datasets: str, section: str = "") -> str:
    return HEAD + "datasets:\n" + datasets + section


def line_of(text: str, written: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if written in line)


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("FLEET_SECRETS_FILE", str(tmp_path / "missing.yml"))
    monkeypatch.setenv("RUNPOD_API_KEY", "rp-test-key")  # a runpod: job may be submitted (no call is made)
    home = tmp_path / "home"
    home.mkdir()
    # A local node as the fleet's own processes (no sandbox): it reads this machine's files, the case where
    # nothing would otherwise travel; a sandboxed one gets the job's files as a rented node does.
    return Settings(
        redis_url=redis_url, home=home, local_jobs_from=(Source.CLI, Source.GIT), local_sandbox="none"
    )


@pytest.fixture
def fleet(settings: Settings, redis_client: redis.Redis[str]) -> Iterator[Fleet]:
    running = Fleet.connect(World.of(settings))
    yield running
    running.redis.close()


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path / "repo")


def watched(fleet: Fleet, repo: Repo) -> Trigger:
    """A trigger on `repo` whose first look is done (it starts from the current head)."""
    trigger = Trigger(fleet, GitRepo.open(repo.root), "sec", ["tasks/*.yml"])
    assert look(trigger, "main", repo.git("rev-parse", "HEAD")).began == Start.FIRST
    return trigger


def settle(trigger: Trigger, repo: Repo, sha: str) -> dict[str, ConfigResult]:
    """Look at the branch up to `sha`; each config's result by path. The snapshot is gone afterwards."""
    results = {r.path: r for r in look(trigger, "main", sha).results}
    snapshots = trigger.fleet.settings.home / gitsnapshot.SNAPSHOTS_DIR
    assert not snapshots.exists() or not any(snapshots.iterdir()), list(snapshots.iterdir())
    return results


def refusal(result: ConfigResult, key: str, line: int) -> str:
    """The message of the one problem at `key` and `line`; the config was refused for good."""
    assert result.outcome is Outcome.INVALID, result
    found = [p for p in result.problems if (p.path, p.line) == (key, line)]
    assert len(found) == 1, result.problems
    assert gitsnapshot.SNAPSHOTS_DIR not in result.message and "Traceback" not in result.message
    return found[0].message


REACHES = {  # a config's datasets, the key refused, what the refusal says ({sha}: the commit's short sha)
    "the clone's .git beside the commit": (
        "  - path: ..\n    type: alpaca\n    data_files:\n      - .git/config\n",
        "datasets[0].data_files[0]",
        "file not found: .git/config in {sha}:",  # (the top of the commit's tree)
    ),
    "the clone's .git from a data file": (
        "  - path: json\n    type: alpaca\n    data_files:\n      - ../.git/config\n",
        "datasets[0].data_files[0]",
        "file not found: ../.git/config (relative paths are looked up in {sha}:tasks)",
    ),
    "an untracked file": (
        "  - path: untracked.jsonl\n    type: alpaca\n",
        "datasets[0].path",
        "file not found: untracked.jsonl (relative paths are looked up in {sha}:tasks)",
    ),
    "an ignored file": (
        "  - path: ignored.jsonl\n    type: alpaca\n",
        "datasets[0].path",
        "file not found: ignored.jsonl (relative paths are looked up in {sha}:tasks)",
    ),
    "a committed link to the clone's .git": (
        "  - path: data/creds.jsonl\n    type: alpaca\n",
        "datasets[0].path",
        "data/creds.jsonl is a link that leads outside the job's directory and the data roots",
    ),
}


@pytest.mark.parametrize("reach", REACHES)
def test_a_file_the_commit_does_not_track_is_refused_with_key_and_line(
    fleet: Fleet, repo: Repo, reach: str
) -> None:
    """Each of these named the clone's `.git/config` (and its credential) or a file never committed, which
    the trigger used to take from the working tree; a rented node got a copy of it."""
    datasets, key, expected = REACHES[reach]
    trigger = watched(fleet, repo)
    text = config(datasets, RUNPOD)
    repo.write("tasks/a.yml", text)
    repo.write(".gitignore", "ignored.jsonl\n")
    repo.write("tasks/data/train.jsonl", COMMITTED)
    if "creds" in datasets:  # (alone: a link out anywhere in the tree refuses `path: ..` whatever it names)
        os.symlink(repo.root / ".git" / "config", repo.root / "tasks" / "data" / "creds.jsonl")
    sha = repo.commit(f"a config that names {reach}")
    repo.write("tasks/untracked.jsonl", COMMITTED)  # beside the config, never committed
    repo.write("tasks/ignored.jsonl", COMMITTED)

    result = settle(trigger, repo, sha)["tasks/a.yml"]
    line = line_of(text, ".git/config" if "data_files" in datasets else "path:")
    assert refusal(result, key, line).startswith(expected.format(sha=sha[:7]))
    assert Ledger(fleet.redis).list_runs(10) == []


def test_the_committed_bytes_ship_not_the_working_trees_for_a_rented_and_a_local_node(
    fleet: Fleet, repo: Repo, settings: Settings, redis_url: str, tmp_path: Path
) -> None:
    """A tracked dataset is what its commit holds, copied into the run: on RunPod in ship/ (and nothing
    else from the working tree: no untracked file beside it, even from the repository's top, where `.git`
    is), on the local node by absolute path in the run's own directory, where the node reads it whatever
    its working directory, once the snapshot is gone."""
    trigger = watched(fleet, repo)
    repo.write("top.jsonl", COMMITTED)
    repo.write("tasks/data/train.jsonl", COMMITTED)
    repo.write("tasks/rented.yml", config("  - path: data\n    type: alpaca\n", RUNPOD))
    repo.write("tasks/top.yml", config("  - path: ..\n    type: alpaca\n", RUNPOD))
    repo.write("tasks/local.yml", config("  - path: data/train.jsonl\n    type: alpaca\n"))  # axolotl
    repo.write(
        "tasks/builtin.yml",
        "trainer: builtin\nadapter: lora\n" + config("  - path: data/train.jsonl\n    type: alpaca\n"),
    )
    sha = repo.commit("tracked datasets, four configs")
    repo.write("tasks/data/train.jsonl", ROWS[0] * 3)  # modified in the working tree, not committed
    repo.write("tasks/data/extra.jsonl", COMMITTED)  # untracked, in the dataset's directory
    repo.write("leak.jsonl", COMMITTED)  # untracked, at the top

    results = settle(trigger, repo, sha)
    configs = ("tasks/builtin.yml", "tasks/local.yml", "tasks/rented.yml", "tasks/top.yml")
    assert {p: r.outcome for p, r in results.items()} == dict.fromkeys(configs, Outcome.ENQUEUED), [
        r.message for r in results.values()
    ]
    ledger = Ledger(fleet.redis)
    rented = ledger.get_run(str(results["tasks/rented.yml"].run_id))
    assert shipped(rented) == {"datasets/0/data/train.jsonl": COMMITTED}
    assert rented.spec.train.datasets[0].path == "datasets/0/data"
    top = ledger.get_run(str(results["tasks/top.yml"].run_id))  # the commit's every tracked file, only
    dataset = Path(top.spec.train.datasets[0].path)
    tracked = repo.git("ls-tree", "-r", "--name-only", sha).split()
    assert {name.removeprefix(f"{dataset.as_posix()}/"): data for name, data in shipped(top).items()} == {
        name: repo.committed(sha, name) for name in tracked
    }

    local = [ledger.get_run(str(results[f"tasks/{name}.yml"].run_id)) for name in ("local", "builtin")]
    ctx = context.init(settings, redis_url)
    try:
        for run in local:
            job = train_job(ctx, run)  # what the local node gets: the run's own directory, no files travel
            assert job.work_dir == run.run_dir and files_for_node(ctx, run) is None
            path = Path(run.spec.train.datasets[0].path)
            assert path == ship_dir(run.run_dir) / "datasets" / "0" / "train.jsonl"
            assert path.read_bytes() == COMMITTED
            if isinstance(job.config, TrainConfig):  # what each trainer reads, from another directory
                assert len(load_records(job.config.datasets, base_dir=tmp_path)) == len(ROWS)
            else:
                assert axolotl_run.local_dataset_files(job, tmp_path) == [path]
    finally:
        ctx.redis.close()


def shipped(run: Run) -> dict[str, bytes]:
    """Every file in the run's ship/, by its path there, with its bytes."""
    ship = ship_dir(run.run_dir)
    return {p.relative_to(ship).as_posix(): p.read_bytes() for p in ship.rglob("*") if p.is_file()}


def test_a_commit_tracking_more_than_the_snapshot_limit_is_refused_not_written(
    fleet: Fleet, repo: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    trigger = watched(fleet, repo)
    repo.write("tasks/data/train.jsonl", COMMITTED)
    text = config("  - path: data/train.jsonl\n    type: alpaca\n")
    repo.write("tasks/a.yml", text)
    sha = repo.commit("a dataset over the (lowered) limit")
    monkeypatch.setattr(gitsnapshot, "SNAPSHOT_LIMIT_BYTES", len(COMMITTED))
    result = settle(trigger, repo, sha)["tasks/a.yml"]
    assert result.outcome is Outcome.INVALID and len(result.problems) == 1, result
    size = len(COMMITTED) + len(text)
    assert f"commit {sha[:7]} tracks 2 files of {size} bytes" in result.message, result.message
    assert f"at most 100000 files of {len(COMMITTED)} bytes" in result.message


@pytest.mark.parametrize("attack", ["dotdot", "through a link", "a NUL in a link"])
def test_a_crafted_tree_is_refused_and_nothing_is_written_outside_its_snapshot(
    fleet: Fleet, repo: Repo, tmp_path: Path, attack: str
) -> None:
    """Trees that git itself never checks out but a pushed commit may hold (`git mktree` makes them): an
    entry `..`, or one name twice, a link to a directory outside and a directory with a file in it."""
    trigger = watched(fleet, repo)
    outside = tmp_path / "outside"
    outside.mkdir()
    hub = repo.blob(config("  - path: tatsu-lab/alpaca\n    type: alpaca\n").encode())
    data = repo.tree(f"100644 blob {repo.blob(COMMITTED)}\tx.jsonl")
    tasks = repo.tree(f"100644 blob {hub}\ta.yml")
    if attack == "dotdot":
        top = repo.tree(f"040000 tree {tasks}\ttasks", f"040000 tree {data}\t..")
        written = fleet.settings.home / gitsnapshot.SNAPSHOTS_DIR / "x.jsonl"
    elif attack == "a NUL in a link":  # (os.symlink raises ValueError for it: never past the look)
        link = repo.blob(str(outside / "x.jsonl").encode() + b"\0")
        top = repo.tree(f"040000 tree {tasks}\ttasks", f"120000 blob {link}\tdata")
        written = outside / "x.jsonl"
    else:
        link = repo.blob(str(outside).encode())
        top = repo.tree(
            f"040000 tree {tasks}\ttasks", f"120000 blob {link}\tdata", f"040000 tree {data}\tdata"
        )
        written = outside / "x.jsonl"
    sha = repo.git("commit-tree", top, "-p", "HEAD", "-m", f"a crafted tree: {attack}")
    repo.git("update-ref", "refs/heads/main", sha)

    result = settle(trigger, repo, sha)["tasks/a.yml"]
    assert result.outcome is Outcome.INVALID, result
    expected = {
        "dotdot": "a path git itself does not check out",
        "through a link": "data: a name the tree holds twice",
        "a NUL in a link": "data: a link whose target holds a NUL byte",
    }[attack]
    assert expected in result.message and not written.exists(), result.message
