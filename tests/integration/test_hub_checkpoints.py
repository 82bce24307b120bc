"""hub_strategy: checkpoints go to the hub as they are written, and a new node resumes from there."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import constants

from tests.factories import train_config, train_job
from tests.fakes.hub import FakeHub
from trainer import progress
from trainer.faults import InjectedCrash
from trainer.train import train

pytestmark = pytest.mark.integration
TOKEN = "hf_ckptcanary0123456789abcdefghijklmn"


def test_a_new_node_resumes_from_the_checkpoint_on_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the fake speaks plain HTTP and LFS
    with FakeHub(home=tmp_path / "hub", token=TOKEN, user="me") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        config = train_config(
            max_steps=6, save_steps=2, eval_table_size=0, hub_model_id="me/ckpt", hub_strategy="checkpoint"
        )
        cache = tmp_path / "cache"
        monkeypatch.setenv("FLEET_INJECT", "crash_after_step:4")
        with pytest.raises(InjectedCrash):  # the first node dies after its step-4 checkpoint
            train(train_job(tmp_path / "node1", config, cache_dir=cache), tmp_path)
        (repo,) = hub.state()["repos"]
        assert repo["private"] and {"last-checkpoint/trainer_state.json", "last-checkpoint/optimizer.pt"} <= {
            f["path"] for f in repo["files"]
        }
        first = list(progress.parse(capsys.readouterr().out))
        assert [r["hub"] for r in first if r["kind"] == "checkpoint"] == ["last-checkpoint"] * 2

        monkeypatch.delenv("FLEET_INJECT")
        second_job = train_job(tmp_path / "node2", config, cache_dir=cache)  # nothing of the run on it
        metrics = train(second_job, tmp_path)
        records = list(progress.parse(capsys.readouterr().out))
        (resumed,) = [r for r in records if r["kind"] == "resumed"]
        assert resumed["step"] == 4 and metrics["global_step"] == 6
        steps = [r["step"] for r in records if r["kind"] == "step"]
        assert steps and min(steps) > 4  # it went on from step 4, not from 0
