"""The tiny job with `hub_model_id` and a W&B project: trained through `fleet run` with W&B online against
a fake W&B server (tests/fakes/wandb.py: the real wandb client on the node writes to it), then pushed from
the node to a local fake of the Hugging Face Hub by huggingface_hub itself; the tokens reach the node and
nothing else; the one W&B run holds the whole story of that run, its URL is the one the fleet announced
at provision, the model card links it, and the Discord notifier posts it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from huggingface_hub import ModelCard, hf_hub_download

from bot.notifier import Notifier
from core.settings import Settings
from providers.registry import load_fleet_secrets
from tests.factories import EXAMPLE_YAML, copy_example_data
from tests.fakes import FakeDiscord
from tests.fakes.hub import FakeHub
from tests.fakes.wandb import FakeWandb
from tests.integration.fleetproc import events_of, fleet, fleet_env, ledger_of, live_heads, secret_hits

pytestmark = pytest.mark.integration
TOKEN = "hf_fakecanary0123456789abcdefghijklmnop"
WANDB_KEY = "wandbcanary" + "0a1b2c3d4e5f" * 2 + "a1b2c3d4e"  # 40 characters, as W&B's keys are
CHANNEL = 323456789012345678


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
    home: Path, hub: FakeHub, tmp_path: Path, fake_discord: FakeDiscord
) -> None:
    with FakeWandb(api_key=WANDB_KEY) as wb:
        env = fleet_env(
            home,
            HF_ENDPOINT=hub.url,
            HF_HUB_DISABLE_XET="1",
            HF_TOKEN=TOKEN,
            WANDB_BASE_URL=wb.url,
            WANDB_API_KEY=WANDB_KEY,
            WANDB_ENTITY="tester",
        )
        done = fleet(env, "run", str(hub_job(tmp_path, "tester/tiny-lora")), "--json", timeout=420)
        assert done.returncode == 0, (hub.state()["requests"], done.stdout[-300:], done.stderr[-2000:])
        view = json.loads(done.stdout)
        assert view["state"] == "SUCCEEDED", hub.state()
        written, wb_url = wb.state(), wb.url

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
    # The tokens went to the node's environment only: not the ledger, the events or the run's files.
    for secret in (TOKEN, WANDB_KEY):
        assert secret_hits(home, secret) == []
        assert secret not in done.stdout + done.stderr
    assert live_heads(home) == []

    # W&B: announced at provision, before the node was asked for, with the URL of the run the node wrote.
    evs = events_of(home, view["run_id"])
    kinds = [e["type"] for e in evs]
    assert kinds.index("wandb.run") < kinds.index("instance.requested")
    (announced,) = [e["data"] for e in evs if e["type"] == "wandb.run"]
    wandb_id = f"tf-{view['run_id']}"
    url = f"{wb_url}/tester/tiny-demo/runs/{wandb_id}"
    assert announced["run_id"] == wandb_id and announced["mode"] == "online" and announced["url"] == url
    assert f"The W&B run: [{url}]({url})" in card.text  # the card links that same run
    # One run on the W&B server, written online by the node's wandb, holding the whole story.
    assert written["refused"] == [], written["refused"]  # everything the client sent was answered
    (run,) = written["runs"]
    assert (run["entity"], run["project"], run["name"]) == ("tester", "tiny-demo", wandb_id)
    assert run["complete"] and run["exit_code"] == 0
    summary, rows = run["summary"], run["rows"]
    assert summary["lifecycle/stage.finished/seconds"] > 0  # provision and prepare times
    assert "lifecycle/instance.requested/price_per_hour" in summary
    assert len([r for r in rows if "train/loss" in r]) == 18  # 90 steps, one row per 5
    assert summary["final/eval_loss"] == view["metrics"]["eval_loss"]
    tables = [r for r in rows if r.get("eval/samples", {}).get("_type") == "table-file"]
    assert len(tables) == 6 and all(t["eval/samples"]["nrows"] == 4 for t in tables)  # steps 0, 20, ..., 90
    assert len([a for a in written["artifacts"] if a["state"] == "COMMITTED"]) == 7  # the tables, lifecycle's
    assert run["config"]["hub_model_id"]["value"] == "tester/tiny-lora"

    # Discord: the fleet's notifier, reading this run's events, posts the same URL.
    hook_id, hook_token = fake_discord.add_webhook(CHANNEL)
    settings = Settings(
        discord_webhook_url=f"{fake_discord.url}/api/webhooks/{hook_id}/{hook_token}",
        discord_api_base=f"{fake_discord.url}/api/v10",
    )
    with requests.Session() as session:
        notifier = Notifier.from_settings(settings, ledger_of(env), load_fleet_secrets(), session)
        for _ in range(1000):  # until it has nothing left to post; an error that stays is the test's failure
            if not (notifier.process_once() or notifier.last_error):
                break
        assert notifier.last_error is None, notifier.last_error
    posted = json.dumps(fake_discord.state()["channels"].get(str(CHANNEL), []))
    assert url in posted and wandb_id in posted
    assert WANDB_KEY not in posted and TOKEN not in posted


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


@pytest.mark.parametrize(
    ("key", "entity", "said"),
    [
        (None, None, "wandb_project: cannot submit: W&B online needs WANDB_API_KEY"),
        ("0" * 40, None, "wandb_project: cannot submit: W&B at"),  # a key W&B does not know
        (WANDB_KEY, "someone", "wandb_entity: cannot submit: WANDB_API_KEY is tester's (no teams)"),
    ],
)
def test_an_online_wandb_run_wandb_would_refuse_is_refused_at_submit(
    home: Path, hub: FakeHub, tmp_path: Path, key: str | None, entity: str | None, said: str
) -> None:
    """The node opens the W&B run after the GPU is rented and the model fetched: W&B is asked first."""
    job = hub_job(tmp_path, "tester/refused")
    if entity:
        job.write_text(
            job.read_text().replace(
                "wandb_project: tiny-demo\n", f"wandb_project: tiny-demo\nwandb_entity: {entity}\n"
            )
        )
    with FakeWandb(api_key=WANDB_KEY) as wb:
        env = fleet_env(
            home, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_TOKEN=TOKEN, WANDB_BASE_URL=wb.url
        )
        env.pop("WANDB_API_KEY", None)
        if key:
            env["WANDB_API_KEY"] = key
        done = fleet(env, "enqueue", str(job), timeout=120)
    assert done.returncode != 0
    assert said in done.stderr, done.stderr
    assert key is None or key not in done.stderr + done.stdout  # named, never shown
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())  # nothing was enqueued
