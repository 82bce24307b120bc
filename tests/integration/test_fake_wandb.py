"""The W&B fake against the real wandb client (its Go core), through the trainer's own `open_run`: a run
written online, continued by a second writer at its history's end, its tables saved as committed
artifacts; a key W&B does not know, or an entity the user may not write to, fails as it does there.
And the fleet's question at submit (service.wandbkey) gets the answers W&B gives."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wandb
from pydantic import SecretStr

from service.wandbkey import wandb_refusal
from tests.factories import train_config, train_job
from tests.fakes.wandb import DEFAULT_KEY, FakeWandb
from trainer import progress, recipe
from trainer.config import WandbPlan
from trainer.tiny import resolve_model
from trainer.tracking import open_run

pytestmark = pytest.mark.integration


@pytest.fixture
def fake() -> Iterator[FakeWandb]:
    with FakeWandb(teams=("lab",)) as fake:
        yield fake


def settings(fake: FakeWandb, key: str = DEFAULT_KEY) -> Any:
    return wandb.Settings(base_url=fake.url, api_key=key, init_timeout=60, x_disable_stats=True)


def segment(
    fake: FakeWandb,
    tmp_path: Path,
    steps: range,
    exit_code: int,
    entity: str = "tester",
    run_id: str = "tf-r1",
) -> str:
    """One writer of the run `run_id`: a table, a row per step, a summary value, then finish."""
    plan = WandbPlan(run_id=run_id, project="demo", entity=entity, mode="online")
    run = open_run(plan, "r1", tmp_path, {"learning_rate": 0.1, "hub_token": "hf_x"}, settings(fake))
    try:
        run.define_metric("train/global_step")
        run.define_metric("*", step_metric="train/global_step")
        run.log({"lifecycle/events": wandb.Table(columns=["t", "event"], data=[[0.5, "run.queued"]])})
        for step in steps:
            run.log({"train/global_step": step, "train/loss": 10.0 - step})
        run.summary["segment_exit"] = exit_code
        url = str(run.url)
    finally:
        run.finish(exit_code=exit_code)
    return url


def test_a_run_continued_online_is_one_run_with_its_whole_history(fake: FakeWandb, tmp_path: Path) -> None:
    environ = dict(os.environ)
    first = segment(fake, tmp_path / "a", range(0, 3), exit_code=1)
    second = segment(fake, tmp_path / "b", range(3, 6), exit_code=0)
    # Opening runs leaves this process's environment as it was, once the client is torn down (which takes
    # back its own WANDB_SERVICE): a WANDB_SILENT set here reached every process a later test started (a
    # recipe's shell, whose W&B lines it then did not print).
    wandb.teardown()
    assert dict(os.environ) == environ
    assert first == second == f"{fake.url}/tester/demo/runs/tf-r1"  # a W&B Server at host:port: its pages
    state = fake.state()
    assert state["refused"] == [], state["refused"]  # nothing the client sent went unanswered
    (run,) = state["runs"]
    assert (run["entity"], run["project"], run["name"]) == ("tester", "demo", "tf-r1")
    assert run["resumed"] == 1 and run["complete"] and run["exit_code"] == 0
    rows = run["rows"]
    # The second writer appended after the first's rows, its `_step` going on from there.
    assert [r["_step"] for r in rows] == list(range(len(rows)))
    assert [r["train/global_step"] for r in rows if "train/loss" in r] == [0, 1, 2, 3, 4, 5]
    assert run["summary"]["segment_exit"] == 0 and run["summary"]["train/loss"] == 5.0
    assert run["config"]["learning_rate"]["value"] == 0.1
    assert run["config"]["hub_token"]["value"] == "<redacted>"  # the trainer's own cleaning, seen by W&B
    assert {"wandb-summary.json", "wandb-metadata.json", "config.yaml"} <= set(run["files"])
    tables = [a for a in state["artifacts"] if a["type"] == "run_table"]
    assert len(tables) == 2 and all(a["state"] == "COMMITTED" and a["run"] == "tf-r1" for a in tables)
    assert all({"lifecycle/events.table.json", "wandb_manifest.json"} <= set(a["files"]) for a in tables)


def test_a_key_wandb_does_not_know_fails_the_run_at_init(fake: FakeWandb, tmp_path: Path) -> None:
    plan = WandbPlan(run_id="tf-r2", project="demo", entity="tester", mode="online")
    with pytest.raises(Exception, match=r"(?i)api key|401|not logged in|unauthorized|credentials"):
        open_run(plan, "r2", tmp_path, {}, settings(fake, key="0" * 40))
    assert fake.state()["runs"] == [] and fake.state()["refused"]


def test_a_run_under_an_entity_the_user_is_not_in_is_refused(fake: FakeWandb, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="permission denied"):
        segment(fake, tmp_path, range(1), exit_code=0, entity="someone-else", run_id="tf-r3")
    assert fake.state()["runs"] == []
    segment(fake, tmp_path / "team", range(1), exit_code=0, entity="lab", run_id="tf-r4")  # the user's team
    (run,) = fake.state()["runs"]
    assert run["entity"] == "lab"


def test_the_fleet_asks_wandb_at_submit_what_it_would_refuse(fake: FakeWandb) -> None:
    key = SecretStr(DEFAULT_KEY)
    assert wandb_refusal(fake.url, key, None) is None
    assert wandb_refusal(fake.url, key, "tester") is None and wandb_refusal(fake.url, key, "lab") is None
    wrong = wandb_refusal(fake.url, SecretStr("0" * 40), None)
    assert wrong is not None and not wrong.entity and "does not accept WANDB_API_KEY (401)" in wrong.why
    elsewhere = wandb_refusal(fake.url, key, "someone-else")
    assert elsewhere is not None and elsewhere.entity
    assert (
        elsewhere.why
        == "WANDB_API_KEY is tester's (teams: lab): it cannot write runs under the entity someone-else"
    )
    assert wandb_refusal("http://127.0.0.1:9", key, "someone-else") is None  # W&B unreachable: not a refusal


def test_a_trainer_that_cannot_open_its_wandb_run_trains_on_and_says_why(
    fake: FakeWandb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """W&B refusing the node's key (revoked since submit) or down past the client's timeout costs the W&B
    run, not the training the node is paid for: the trainer goes on and a WANDB line says why."""
    monkeypatch.setenv("WANDB_BASE_URL", fake.url)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # a key this W&B does not take
    wandb.teardown()  # the wandb singleton reads the environment when it is set up
    config = train_config(max_steps=2, eval_steps=2, logging_steps=1)
    url = f"{fake.url}/tester/demo/runs/tf-down"  # planned at provision, never opened
    plan = WandbPlan(run_id="tf-down", project="demo", entity="tester", mode="online", url=url)
    try:
        metrics = recipe.run(
            train_job(tmp_path, config, wandb=plan), resolve_model(config.base_model, tmp_path / "c")
        )
    finally:
        wandb.teardown()
    assert metrics["global_step"] == 2 and (tmp_path / "out" / "adapter_config.json").exists()
    lines = list(progress.parse(capsys.readouterr().out))
    (down,) = [line for line in lines if line["kind"] == "wandb"]
    assert down["status"] == "unavailable" and "returned error 401" in down["error"], down
    assert [line["kind"] for line in lines].count("finished") == 1
    assert fake.state()["runs"] == []
    card = (tmp_path / "out" / "README.md").read_text()
    assert "W&B run" not in card and url not in card  # the card links no run W&B never opened
