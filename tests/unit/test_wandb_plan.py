"""workers.wandb_plan: which W&B run a job gets, decided at provision."""

from __future__ import annotations

from typing import Any

from core.settings import Settings
from jobs.spec import JobSpec
from tests.factories import train_config
from trainer.config import WandbPlan


def spec(**train: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"train": train_config(**train).model_dump(mode="json"), "provider": "local", "section": {}}
    )


def test_one_fleet_run_is_one_wandb_run() -> None:
    from workers.wandb_plan import plan

    settings = Settings(wandb_entity="team")
    assert plan(settings, spec(), "r1") is None  # no wandb_project: no W&B
    assert plan(settings, spec(wandb_project="p", wandb_mode="disabled"), "r1") is None
    online = plan(settings, spec(wandb_project="p", wandb_name="tiny"), "261129-1")
    assert online == WandbPlan(
        run_id="tf-261129-1",
        project="p",
        entity="team",
        name="tiny",
        mode="online",
        url="https://wandb.ai/team/p/runs/tf-261129-1",
    )
    offline = plan(Settings(wandb_mode="offline"), spec(wandb_project="p", wandb_run_id="mine"), "r1")
    assert offline is not None and offline.run_id == "mine" and offline.url is None
    no_entity = plan(Settings(), spec(wandb_project="p"), "r1")
    assert no_entity is not None and no_entity.url is None
    grouped = plan(Settings(), spec(wandb_project="p"), "r1", group="sw-1")  # a sweep's run
    assert grouped is not None and grouped.group == "sw-1" and online is not None and online.group is None
