"""The run's W&B run, as the fleet decides it at provision and hands it to the trainer.

Its id is the job's `wandb_run_id`, else `tf-<run id>`; its URL is known up front when the mode is online
and the entity is known (the job's `wandb_entity`, else WANDB_ENTITY). The `wandb.run` event announces
both the moment the run starts provisioning. What the trainer gets besides (`lifecycle`) is the story so
far, from the run's events: queued, the node asked for (and its price), ready, the download's size and
speed, with the seconds each stage took.
"""

from __future__ import annotations

from typing import Any

from broker.events import read_run
from broker.models import EventType, Run
from core.settings import Settings
from jobs.spec import JobSpec
from trainer.config import WandbPlan
from workers import context

# The events before training that the W&B run shows, and the numbers worth keeping from each.
LIFECYCLE = {
    EventType.RUN_QUEUED: (),
    EventType.INSTANCE_REQUESTED: ("price_per_hour",),
    EventType.INSTANCE_READY: (),
    EventType.STAGE_FINISHED: ("stage", "seconds"),
    EventType.PREPARE_FETCHED: ("examples",),
}


def plan(settings: Settings, spec: JobSpec, run_id: str, group: str | None = None) -> dict[str, Any] | None:
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
        url = f"{settings.wandb_app_url.rstrip('/')}/{entity}/{train.wandb_project}/runs/{run_id_wb}"
    return {
        "run_id": run_id_wb,
        "project": train.wandb_project,
        "entity": entity,
        "name": train.wandb_name,
        "mode": mode,
        "url": url,
        **({"group": group} if group else {}),
    }


def for_trainer(ctx: context.Context, run: Run) -> WandbPlan | None:
    """The plan recorded at provision, with the lifecycle so far."""
    planned = run.progress.get("wandb")
    if not planned:
        return None
    lifecycle = []
    for _sid, event in read_run(ctx.redis, run.run_id):
        keep = LIFECYCLE.get(event.type)
        if keep is None:
            continue
        row: dict[str, Any] = {"t": round(event.time, 3), "event": event.type.value}
        row.update({k: event.data[k] for k in keep if k in event.data})
        if event.type == EventType.PREPARE_FETCHED:
            download = event.data.get("download") or {}
            kept = ("bytes", "seconds", "mb_per_s")
            row.update({f"download_{k}": download[k] for k in kept if k in download})
        lifecycle.append(row)
    return WandbPlan(**planned, lifecycle=lifecycle)
