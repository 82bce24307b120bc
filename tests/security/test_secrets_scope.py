"""Issue 19, finding 3: a rented node gets the fleet's HF_TOKEN and WANDB_API_KEY only when its job needs
them. provision's real step launches the node on the fake RunPod (through the real client) with a real
Redis, and asks a fake Hub (a real HTTP server, which serves private repos to nobody without the token)
which repos the node could read without the token; the pod's environment shows what the node got."""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs.spec import JobSpec
from providers.registry import FleetSettings
from providers.runpod.section import RunPodSection
from state.models import Run
from state.stages import RunState
from tests.factories import TINY_DATA, train_config
from tests.fakes.hub import FakeHub
from tests.fakes.runpod import FakeRunPod
from trainer import progress
from trainer.config import ENV_PREFIX
from workers import context
from workers.node_job import node_env
from workers.stages import provision

pytestmark = pytest.mark.integration
HF = "hf_scopecanary" + "Q7w8E9r0" * 3
WANDB = "wandbcanary" + "ab12cd34" * 4
SECTION = RunPodSection(gpu="NVIDIA RTX A5000", max_bid_per_gpu=0.5)
ALPACA = {"type": "alpaca"}


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub(home=tmp_path / "hub", token=HF) as hub:
        hub.put_files("pub/model", {"config.json": b"{}"})
        hub.put_files("me/private-model", {"config.json": b"{}"}, private=True)
        hub.put_files("pub/data", {"train.jsonl": b"{}\n"}, repo_type="dataset")
        hub.put_files("me/private-data", {"train.jsonl": b"{}\n"}, private=True, repo_type="dataset")
        yield hub


@pytest.fixture
def fake(fleet_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunPod]:
    # The pod never becomes ready here: only what it was started with matters.
    with FakeRunPod(api_key="rp-key", home=fleet_home / "fake", nodes="none", ready_delay_s=600) as fake:
        for name, value in {"RUNPOD_API_KEY": "rp-key", "HF_TOKEN": HF, "WANDB_API_KEY": WANDB}.items():
            monkeypatch.setenv(name, value)
        yield fake


def make_ctx(redis_url: str, fleet_home: Path, fake: FakeRunPod, hf_endpoint: str) -> context.Context:
    from broker.app import configure

    settings = FleetSettings(
        home=fleet_home, runpod_api_base_url=fake.url, hf_endpoint=hf_endpoint, wandb_mode="online"
    )
    configure(settings, redis_url)
    return context.init(settings, redis_url)


@pytest.fixture
def ctx(
    redis_client: redis.Redis[str], redis_url: str, fleet_home: Path, fake: FakeRunPod, hub: FakeHub
) -> context.Context:
    return make_ctx(redis_url, fleet_home, fake, hub.url)


def queued(ctx: context.Context, **train: Any) -> Run:
    spec = JobSpec(train=train_config(**train), provider="runpod", section=SECTION)
    run = Run(run_id="r1", provider="runpod", source="t", spec=spec, run_dir="/r", output_dir="/r/o")
    assert run.state == RunState.QUEUED
    ctx.ledger.create_run(run, [])
    return run


def node_got(ctx: context.Context, fake: FakeRunPod, run: Run) -> set[str]:
    """Provision's step once (the node is launched); which of the two credentials its pod got."""
    provision.step(ctx, run)
    (pod,) = fake.instances.values()
    assert pod.env.get("HF_TOKEN") in (None, HF) and pod.env.get("WANDB_API_KEY") in (None, WANDB)
    return {name for name in ("HF_TOKEN", "WANDB_API_KEY") if name in pod.env}


LOCAL = [{"path": str(TINY_DATA), **ALPACA}]
CASES = {
    "nothing from the hub, no W&B": ({}, set()),
    "a public base model and dataset": (
        {"base_model": "pub/model", "datasets": [{"path": "pub/data", **ALPACA}]},
        set(),
    ),
    "a private base model": ({"base_model": "me/private-model"}, {"HF_TOKEN"}),
    "a private hub dataset": ({"datasets": [*LOCAL, {"path": "me/private-data", **ALPACA}]}, {"HF_TOKEN"}),
    "a base model the hub does not know": ({"base_model": "me/no-such-model"}, {"HF_TOKEN"}),
    "a push to the hub": ({"hub_model_id": "me/tiny-lora"}, {"HF_TOKEN"}),
    "an online W&B run": ({"wandb_project": "tiny"}, {"WANDB_API_KEY"}),
    "an offline W&B run": ({"wandb_project": "tiny", "wandb_mode": "offline"}, set()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_node_gets_only_the_credentials_its_job_needs(
    ctx: context.Context, fake: FakeRunPod, hub: FakeHub, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    train, expected = CASES[case]
    caplog.set_level(logging.INFO, logger="trainfleet.workers")
    assert node_got(ctx, fake, queued(ctx, **train)) == expected
    said = caplog.text
    assert HF not in said and WANDB not in said  # each decision is in the log, never a value
    for name in ("HF_TOKEN", "WANDB_API_KEY"):
        assert (f"its node gets {name}" in said) == (name in expected), said


def test_when_the_hub_cannot_be_asked_the_node_gets_the_token_and_the_log_says_why(
    redis_client: redis.Redis[str],
    redis_url: str,
    fleet_home: Path,
    fake: FakeRunPod,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    ctx = make_ctx(redis_url, fleet_home, fake, nowhere)
    caplog.set_level(logging.INFO, logger="trainfleet.workers")
    assert node_got(ctx, fake, queued(ctx, base_model="pub/model")) == {"HF_TOKEN"}
    (warned,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "gets HF_TOKEN: base_model pub/model: the Hub could not be asked" in warned.getMessage()


def test_a_secret_that_got_past_validate_is_not_in_the_ray_jobs_environment(ctx: context.Context) -> None:
    """12c, the fleet's side: a run in the ledger from before job files were scanned (its spec read back
    as the ledger does, unchecked) sends its Ray jobs a config with the value blanked."""
    raw = train_config().model_dump(mode="json") | {"hub_token": HF, "extras": {"api_key": "abc123"}}
    spec = JobSpec.model_validate({"train": raw, "provider": "runpod", "section": SECTION.model_dump()})
    run = Run(run_id="r2", provider="runpod", source="t", spec=spec, run_dir="/r", output_dir="/r/o")
    env = node_env(ctx, run)
    sent = json.loads(base64.b64decode(env[progress.ENV_VAR][len(ENV_PREFIX) :]))
    assert sent["config"]["hub_token"] == "<redacted>" and sent["config"]["extras"] == {
        "api_key": "<redacted>"
    }
    assert sent["config"]["learning_rate"] == raw["learning_rate"]
    assert HF not in json.dumps(env) and "abc123" not in json.dumps(env)
