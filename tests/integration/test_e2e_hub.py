"""The tiny job with `hub_model_id` and a W&B project: trained through `fleet run` with W&B offline, then
pushed from the node to a local fake of the Hugging Face Hub by huggingface_hub itself; the token reaches
the node and nothing else; the W&B run's own files hold the whole story of that one run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import ModelCard, hf_hub_download

from tests.factories import EXAMPLE_YAML, copy_example_data
from tests.fakes.hub import FakeHub
from tests.integration.fleetproc import events_of, fleet, fleet_env, live_heads, secret_hits
from tests.wandb_log import read_finished_run

pytestmark = pytest.mark.integration
TOKEN = "hf_fakecanary0123456789abcdefghijklmnop"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub(home=tmp_path / "hub", token=TOKEN) as hub:
        yield hub


def hub_job(tmp_path: Path, repo_id: str) -> Path:
    job = tmp_path / "job" / "tiny-hub.yml"
    job.parent.mkdir()
    text = EXAMPLE_YAML.read_text().replace(
        "output_dir: ./outputs\n",
        f"output_dir: ./outputs\nhub_model_id: {repo_id}\nwandb_project: tiny-demo\n",
    )
    job.write_text(
        text.replace(
            "local:\n  one_shot: true\n",
            "local:\n  one_shot: true\n  env:\n    DATABASE_URL: postgres://u:dbcanary77@db/x\n",
        )
    )
    copy_example_data(job.parent)
    return job


def test_the_result_is_pushed_with_a_card_that_names_what_it_is(
    home: Path, hub: FakeHub, tmp_path: Path
) -> None:
    env = fleet_env(home, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_TOKEN=TOKEN, WANDB_MODE="offline")
    done = fleet(env, "run", str(hub_job(tmp_path, "tester/tiny-lora")), "--json", timeout=420)
    assert done.returncode == 0, (hub.state()["requests"], done.stdout[-300:])
    view = json.loads(done.stdout)
    assert view["state"] == "SUCCEEDED", hub.state()

    (repo,) = hub.state()["repos"]
    assert repo["id"] == "tester/tiny-lora" and repo["private"]  # private unless the job says otherwise
    files = {f["path"] for f in repo["files"]}
    assert {"adapter_model.safetensors", "adapter_config.json", "README.md", "metrics.json"} <= files
    assert any(f.startswith("tokenizer") for f in files)
    (pushed,) = [e["data"] for e in events_of(home, view["run_id"]) if e["type"] == "finalize.pushed"]
    assert pushed["repo_id"] == "tester/tiny-lora" and pushed["commit"] == repo["head"]

    readme = hf_hub_download(
        "tester/tiny-lora", "README.md", endpoint=hub.url, token=TOKEN, cache_dir=tmp_path / "c"
    )
    card = ModelCard.load(readme)
    assert card.data.base_model == "trainfleet/tiny-llama" and card.data.library_name == "peft"
    assert card.data.datasets == ["tiny-alpaca.jsonl"]
    assert "hub_model_id: tester/tiny-lora" in card.text and "DATABASE_URL: <redacted>" in card.text
    assert "dbcanary77" not in card.text and TOKEN not in card.text
    # The token went to the node's environment only: not the ledger, the events or the run's files.
    assert secret_hits(home, TOKEN) == []
    assert TOKEN not in done.stdout + done.stderr
    assert live_heads(home) == []

    # W&B: announced at provision, before the node was asked for; one run, holding the whole story.
    evs = events_of(home, view["run_id"])
    kinds = [e["type"] for e in evs]
    assert kinds.index("wandb.run") < kinds.index("instance.requested")
    (announced,) = [e["data"] for e in evs if e["type"] == "wandb.run"]
    assert announced["run_id"] == f"tf-{view['run_id']}" and announced["mode"] == "offline"
    (log,) = (home / "runs" / view["run_id"]).glob("wandb/offline-run-*/run-*.wandb")
    run = read_finished_run(log)
    assert run.run_id == announced["run_id"] and run.project == "tiny-demo" and run.exit_code == 0
    assert run.summary["lifecycle/stage.finished/seconds"] > 0  # provision and prepare times
    assert "lifecycle/instance.requested/price_per_hour" in run.summary
    assert len([r for r in run.history if "train/loss" in r]) == 18  # 90 steps, one row per 5
    assert run.summary["final/eval_loss"] == view["metrics"]["eval_loss"]
    tables = [r for r in run.history if r.get("eval/samples._type") == "table-file"]
    assert len(tables) == 6 and all(t["eval/samples.nrows"] == 4 for t in tables)  # steps 0, 20, ..., 80, 90


def test_a_hub_job_without_a_token_is_refused_at_submit(home: Path, hub: FakeHub, tmp_path: Path) -> None:
    env = fleet_env(home, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1")
    env.pop("HF_TOKEN", None)
    done = fleet(env, "enqueue", str(hub_job(tmp_path, "tester/refused")), timeout=120)
    assert done.returncode != 0
    assert "hub_model_id" in done.stderr and "HF_TOKEN" in done.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())  # nothing was enqueued


READ_TOKEN = "hf_readonlycanary0123456789abcdefghij"


@pytest.mark.parametrize(
    ("token", "repo_id", "said"),
    [
        (READ_TOKEN, "tester/refused", "HF_TOKEN is a read token"),  # the Hub's user is `tester`
        (TOKEN, "someone/refused", "under the namespace someone"),  # a write token, another's namespace
    ],
)
def test_a_push_the_token_cannot_make_is_refused_at_submit(
    home: Path, hub: FakeHub, tmp_path: Path, token: str, repo_id: str, said: str
) -> None:
    """The push comes after the GPU hours: a token the Hub says cannot write there is refused at once."""
    hub.add_token(READ_TOKEN, role="read")
    env = fleet_env(home, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_TOKEN=token)
    done = fleet(env, "enqueue", str(hub_job(tmp_path, repo_id)), timeout=120)
    assert done.returncode != 0
    assert "hub_model_id" in done.stderr and said in done.stderr, done.stderr
    assert token not in done.stderr + done.stdout  # named, never shown
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())  # nothing was enqueued
