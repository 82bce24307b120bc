"""The replay nodes' scripts (tests.fakes.replay), without a server: which job an entrypoint is, the
recorded stream scaled to a run's length with its own directories, and pack lines the fleet can unpack."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.factories import example_config
from tests.fakes.replay import EMITTED, OUTPUT_FILES, Job, Recording, Replayer, kind_of
from trainer import pack, progress
from trainer.config import TrainJob


@pytest.mark.parametrize(
    ("entrypoint", "kind"),
    [
        ("python -m trainer check --gpus=0 --ray=2.9.0 --python=3.11", "check"),
        ("python -m trainer fetch", "fetch"),
        ("python -m trainer train", "train"),
        ("python -m trainer pack --skip-over-limit", "pack"),
        ("python -m trainer push", "push"),
        (shlex.join(["sh", "-c", "echo 'hi'; pip list"]), "entry"),
        ("python -m trainer nothing", None),
        ("sh -c 'unclosed", None),
    ],
)
def test_an_entrypoint_says_which_job_it_is(entrypoint: str, kind: str | None) -> None:
    assert kind_of(entrypoint) == kind


def test_the_recorded_stream_is_a_whole_run() -> None:
    recording = Recording.load()
    kinds = [record["kind"] for _t, record in recording.train]
    assert kinds[0] == "started" and kinds[-2:] == ["finished", "done"]
    assert {"step", "eval", "checkpoint"} <= set(kinds)
    assert recording.fetched["kind"] == "fetched"
    times = [t for t, _record in recording.train_lines(4.0)]
    assert times == sorted(times) and times[0] == 0 and times[-1] == pytest.approx(3.8)


def test_a_train_job_shows_its_lines_as_they_come_with_the_runs_own_directories() -> None:
    replayer = Replayer(train_s=2.0)
    job = TrainJob(run_id="r-1", config=example_config(), work_dir="runs/r-1", output_dir="runs/r-1/outputs")
    replayed = replayer.job(
        "node", "r-1-1-train", "python -m trainer train", {progress.ENV_VAR: job.to_env()}
    )
    start = replayed.started
    assert replayed.status(start + 1.0) == "RUNNING" and replayed.status(start + 2.01) == "SUCCEEDED"
    early = list(progress.parse(replayed.logs(start + 0.01)))
    assert early and early[0]["kind"] == "started" and len(early) < len(replayer.recording.train)
    whole = list(progress.parse(replayed.logs(start + 2.01)))
    assert len(whole) == len(replayer.recording.train)
    assert all(start - 0.001 <= record[EMITTED] <= start + 2.0 for record in whole)  # (4 decimals)
    assert whole[-2]["output_dir"] == "runs/r-1/outputs" and whole[-1]["kind"] == "done"
    paths = [r["path"] for r in whole if r["kind"] == "checkpoint"]
    assert paths and all(path.startswith("runs/r-1/") for path in paths)


def test_a_stopped_job_prints_nothing_more() -> None:
    job = Job("sid", "python -m trainer train", "train", 0.0, 10.0, [(1.0, "a"), (5.0, "b")])
    job.stopped_at = 2.0
    assert job.status(20.0) == "STOPPED" and job.logs(20.0) == "a\n"
    assert job.details(20.0)["end_time"] == 2000


def test_a_pack_job_brings_back_the_output_directory(tmp_path: Path) -> None:
    replayed = Replayer().job("node", "r-1-1-pack", "python -m trainer pack", {})
    packed = pack.unpack(progress.parse(replayed.logs(replayed.ends)), tmp_path / "out")
    assert packed.files == len(OUTPUT_FILES)
    assert {p.name: p.read_text() for p in (tmp_path / "out").iterdir()} == OUTPUT_FILES
