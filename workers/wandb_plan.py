"""The run's W&B run, as the fleet decides it at provision and hands it to the trainer.

Its id is the job's `wandb_run_id`, else `tf-<run id>`; its URL is known up front when the mode is online
and the entity is known (the job's `wandb_entity`, else WANDB_ENTITY). The `wandb.run` event announces
both the moment the run starts provisioning. What the trainer gets besides (`lifecycle`) is the story so
far, from the run's events: queued, the node asked for (and its price), ready, the download's size and
speed, with the seconds each stage took.
"""

from __future__ import annotations

from typing import Any

from core.settings import Settings
from jobs.spec import JobSpec
from state.events import read_run
from state.models import Run
from state.payloads import EventType, PrepareFetched
from trainer.config import WandbPlan
from workers import context

# The events before training that the W&B run shows, and the numbers worth keeping from each.
LIFECYCLE = {
    EventType.RUN_QUEUED: (),
    EventType.INSTANCE_REQUESTED: ("price_per_hour",),
    EventType.INSTANCE_READY: (),
    EventType.STAGE_FINISHED: ("stage", "seconds"),
    EventType.PREPARE_ENTRY: ("status", "exit_code", "seconds"),
    EventType.PREPARE_FETCHED: ("examples",),
}


def plan(settings: Settings, spec: JobSpec, run_id: str, group: str | None = None) -> WandbPlan | None:
    """The W&B run of a job that names a `wandb_project` (None otherwise, or when W&B is disabled); a sweep's
    runs are grouped under the sweep's id."""
    train = spec.train
    mode = train.wandb_mode or settings.wandb_mode
    if not train.wandb_project or mode == "disabled":
        return None
    run_id_wb = train.wandb_run_id or f"tf-{run_id}"
    entity = train.wandb_entity or settings.wandb_entity
    url = None
    if mode == "online" and entity:
        url = f"{pages(settings)}/{entity}/{train.wandb_project}/runs/{run_id_wb}"
    return WandbPlan(
        run_id=run_id_wb,
        project=train.wandb_project,
        entity=entity,
        name=train.wandb_name,
        mode=mode,
        url=url,
        group=group,
    )


def pages(settings: Settings) -> str:
    """Where the W&B run pages are: `wandb_app_url`, else where the wandb client itself puts them for its
    API's address (wandb.util.api_to_app_url: api.wandb.ai's pages are now on CoreWeave's Forge, a W&B
    Server at host:port serves its own), so the URL announced is the one the trainer's run reports."""
    if settings.wandb_app_url:
        return settings.wandb_app_url.rstrip("/")
    from wandb.util import api_to_app_url  # the client's own rule (imported here: wandb is slow to import)

    return str(api_to_app_url(settings.wandb_base_url.rstrip("/"))).rstrip("/")


def for_trainer(ctx: context.Context, run: Run) -> WandbPlan | None:
    """The plan recorded at provision, with the lifecycle so far."""
    planned = run.progress.wandb
    if planned is None:
        return None
    lifecycle = []
    for _sid, event in read_run(ctx.redis, run.run_id):
        keep = LIFECYCLE.get(event.type)
        if keep is None:
            continue
        row: dict[str, Any] = {"t": round(event.time, 3), "event": event.type.value}
        given = event.data.wire()
        row.update({k: given[k] for k in keep if k in given})
        if isinstance(event.data, PrepareFetched) and event.data.download is not None:
            download = event.data.download.model_dump(
                include={"bytes", "seconds", "mb_per_s"}, exclude_unset=True
            )
            row.update({f"download_{k}": v for k, v in download.items()})
        lifecycle.append(row)
    return planned.model_copy(update={"lifecycle": lifecycle})
