"""workers.wandb_plan: which W&B run a job gets, decided at provision."""

from __future__ import annotations

from typing import Any

from core.settings import Settings
from jobs.spec import JobSpec
from tests.factories import train_config
from trainer.config import WandbPlan
from workers.wandb_plan import plan


def spec(**train: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"train": train_config(**train).model_dump(mode="json"), "provider": "local", "section": {}}
    )


def test_one_fleet_run_is_one_wandb_run() -> None:
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
        url="https://forge.coreweave.com/wandb/team/p/runs/tf-261129-1",  # wandb 0.31's pages of api.wandb.ai
    )
    offline = plan(Settings(wandb_mode="offline"), spec(wandb_project="p", wandb_run_id="mine"), "r1")
    assert offline is not None and offline.run_id == "mine" and offline.url is None
    no_entity = plan(Settings(), spec(wandb_project="p"), "r1")
    assert no_entity is not None and no_entity.url is None
    grouped = plan(Settings(), spec(wandb_project="p"), "r1", group="sw-1")  # a sweep's run
    assert grouped is not None and grouped.group == "sw-1" and online is not None and online.group is None


def test_run_pages_are_where_the_wandb_client_puts_them() -> None:
    """The URL the fleet announces is the one the trainer's wandb client reports (wandb.util.app_url)."""
    import wandb.util

    from workers.wandb_plan import pages

    for base in (
        "https://api.wandb.ai",
        "https://api.acme.wandb.io",
        "https://api.wandb.example",
        "http://10.0.0.5:8080",
    ):
        assert pages(Settings(wandb_base_url=base)) == wandb.util.api_to_app_url(base), base
    assert pages(Settings()) == wandb.util.api_to_app_url("https://api.wandb.ai")
    assert pages(Settings(wandb_base_url="http://10.0.0.5:8080/")) == "http://10.0.0.5:8080"
    assert (
        pages(Settings(wandb_app_url="https://pages.example/", wandb_base_url="http://x"))
        == "https://pages.example"
    )
    url = plan(Settings(wandb_entity="me", wandb_base_url="http://w:8080"), spec(wandb_project="p"), "r1")
    assert url is not None and url.url == "http://w:8080/me/p/runs/tf-r1"
