"""trainer.train: where the job comes from, the fetch and train commands, exit codes and messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import train_config, train_job
from trainer import progress
from trainer.errors import DatasetError, JobError
from trainer.train import load_job, main, worker_failure


def write_job(tmp_path: Path, **config: object) -> Path:
    path = tmp_path / "job.json"
    path.write_text(train_job(tmp_path, train_config(**config)).to_env(), encoding="utf-8")
    return path


def test_job_from_file_or_environment(tmp_path: Path) -> None:
    path = write_job(tmp_path)
    from_file = load_job(path, {})
    assert from_file == load_job(None, {progress.ENV_VAR: path.read_text()})
    assert from_file.config.base_model == "trainfleet/tiny-llama"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "no job"),
        ("{", "not a valid TrainJob"),
        ('{"run_id": "r"}', "not a valid TrainJob"),
    ],
)
def test_bad_jobs(text: str | None, message: str) -> None:
    environ = {} if text is None else {progress.ENV_VAR: text}
    with pytest.raises(JobError, match=message):
        load_job(None, environ)


def test_relative_dirs_lie_under_the_node_root(tmp_path: Path) -> None:
    job = train_job(tmp_path, work_dir="runs/r1", output_dir="runs/r1/out", cache_dir=Path("cache"))
    with pytest.raises(
        JobError, match=r"work_dir, output_dir, cache_dir relative but \$FLEET_NODE_ROOT is not set"
    ):
        load_job(None, {progress.ENV_VAR: job.to_env()})
    with pytest.raises(JobError, match="not absolute"):
        load_job(None, {progress.ENV_VAR: job.to_env(), "FLEET_NODE_ROOT": "node"})
    on_node = load_job(None, {progress.ENV_VAR: job.to_env(), "FLEET_NODE_ROOT": "/workspace/tf"})
    assert (on_node.work_dir, on_node.output_dir, on_node.cache_dir) == (
        "/workspace/tf/runs/r1",
        "/workspace/tf/runs/r1/out",
        "/workspace/tf/cache",
    )
    absolute = train_job(tmp_path)
    assert load_job(None, {progress.ENV_VAR: absolute.to_env()}) == absolute  # no root needed


def test_fetch_builds_the_model_and_counts_examples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fetch", "--job", str(write_job(tmp_path))]) == 0
    (record,) = progress.parse(capsys.readouterr().out)
    assert record["kind"] == "fetched" and record["examples"] == 800
    assert Path(record["model_path"], "model.safetensors").is_file()
    assert Path(record["model_path"]).is_relative_to(tmp_path / "cache")


def test_train_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job_file = write_job(tmp_path, max_steps=1, eval_steps=None, save_steps=None)
    assert main(["train", "--job", str(job_file)]) == 0
    kinds = [r["kind"] for r in progress.parse(capsys.readouterr().out)]
    assert kinds == ["started", "eval", "step", "eval", "finished", "done"]  # done: the last line
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["global_step"] == 1


def test_failures_exit_non_zero_with_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    assert main(["train"]) == 1
    assert capsys.readouterr().err.startswith("trainer: error: no job")

    assert main(["train", "--job", str(write_job(tmp_path, base_model="/no/such/model"))]) == 1
    err = capsys.readouterr().err
    assert "/no/such/model" in err and "not a local directory" in err

    bad_data = write_job(tmp_path, datasets=[{"path": str(tmp_path / "missing.jsonl")}])
    assert main(["fetch", "--job", str(bad_data)]) == 1
    assert "missing.jsonl" in capsys.readouterr().err


class _WorkerGroupFailure(Exception):
    """Stands in for ray.train.WorkerGroupError: a message plus the exception of each failed rank."""

    def __init__(self, failures: dict[int, BaseException]) -> None:
        super().__init__("Training failed due to worker errors:\n[Rank 0,1 Error Snippet]: ...")
        self.worker_failures = failures


def test_worker_failure_is_one_line() -> None:
    failures: dict[int, BaseException] = {1: ValueError("later rank"), 0: DatasetError("data.jsonl:2: bad")}
    assert worker_failure(_WorkerGroupFailure(failures)) == "worker rank 0: DatasetError: data.jsonl:2: bad"
    assert worker_failure(RuntimeError("controller died\ndetails")) == "controller died"


def test_a_node_without_gpus_trains_on_cpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.train import without_missing_gpus

    wants_gpu = train_job(tmp_path).model_copy(update={"use_gpu": True})
    assert without_missing_gpus(wants_gpu, gpus=2).use_gpu is True
    assert capsys.readouterr().err == ""
    assert without_missing_gpus(wants_gpu, gpus=0).use_gpu is False
    assert "asks for GPUs but this node has none" in capsys.readouterr().err
