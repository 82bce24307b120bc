"""The run's W&B run, written by rank 0 of the trainer: lifecycle, metrics, eval samples, the end.

One fleet run is one W&B run. The fleet decides its id (and, when it can, its URL) at provision and
announces it at once; the trainer opens it when training starts, first writing what happened before
(provision, download and the node's price, from the plan's lifecycle), then every progress line it
emits (loss, learning rate, eval loss, checkpoints, rollbacks), the eval samples as a table per eval,
and, if training fails, the reason; it finishes the run with the exit code that says which. Reporting
is explicit: transformers 5 reports nowhere by default. The x-axis is `train/global_step`, so a rollback
(steps going back) never has its rows dropped as out of order.

A train job that runs again (a restart from a checkpoint) opens the same id: online, W&B continues it
(`resume="allow"`); offline, it becomes a second segment on disk, since offline runs cannot be resumed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer import lines
from trainer.config import TrainJob, WandbPlan, as_jsonable

SAMPLE_COLUMNS = ("step", "input", "prediction", "label")
REDACTED = "<redacted>"
# The node's own short list of what a credential looks like (it cannot import the fleet's jobs.secretscan,
# which refuses such values at validate): a config value matching one, or any value under a key named
# like a credential, never reaches the W&B run's config.
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9_-])(hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,}|rpa_[A-Za-z0-9]{30,}"
    r"|sk-[A-Za-z0-9_-]{32,}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{60,}|local-[0-9a-f]{40}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,})|(?<![A-Z0-9])(AKIA|ASIA)[A-Z0-9]{16}|-----BEGIN [A-Z0-9 ]*PRIVATE KEY"
)
_SECRET_KEY = re.compile(
    r"(^|[^a-z])(token|secret|passw(or)?d|passphrase|api_?key|access_?key|private_?key)($|[^a-z])"
)
_TOKENIZER_KEYS = frozenset({"bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token"})


class Tracker:
    """A W&B run, or nothing at all when the job has none or this is not rank 0."""

    def __init__(self, job: TrainJob, is_main: bool) -> None:
        self.job = job
        self.plan = job.wandb if is_main else None
        self.run: Any = None

    @property
    def url(self) -> str | None:
        """The run's page (known once it started online), else what the fleet planned."""
        if self.run is not None and getattr(self.run, "url", None):
            return str(self.run.url)
        return self.plan.url if self.plan is not None else None

    def start(self) -> None:
        """Open the run and write what happened before training. When W&B cannot be opened (down past the
        client's init timeout, or refusing the key), training goes on without it and a WANDB progress line
        says why: the run's metrics still reach the fleet, and losing them to W&B costs less than the
        node's hours."""
        plan = self.plan
        if plan is None:
            return
        work = Path(self.job.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        config = {**as_jsonable(self.job.config), "fleet_run_id": self.job.run_id}
        try:
            self.run = open_run(plan, self.job.run_id, work, config)
        except Exception as exc:  # noqa: BLE001 - W&B is a report: a paid node trains on without it
            error = f"{type(exc).__name__}: {str(exc)[:500]}"
            lines.emit(lines.WandbUnavailable(status="unavailable", error=error))
            self.plan = None  # no W&B run for this trainer, as on the other ranks: nothing to write or link
            return
        self.run.define_metric("train/global_step")
        self.run.define_metric("*", step_metric="train/global_step")
        log_lifecycle(self.run, plan.lifecycle)

    def record(self, line: lines.Line) -> None:
        """Mirror one progress line."""
        if self.run is None:
            return
        if isinstance(line, lines.Step):
            self.run.log(
                {
                    "train/global_step": line.step,
                    "train/loss": line.loss,
                    "train/learning_rate": line.learning_rate,
                    "train/epoch": line.epoch,
                }
            )
        elif isinstance(line, lines.Eval):
            self.run.log({"train/global_step": line.step, "eval/loss": line.eval_loss})
        elif isinstance(line, lines.Checkpoint):
            self.run.log({"train/global_step": line.step, "train/checkpoint": line.step})
        elif isinstance(line, lines.Rollback):
            self.run.log(
                {
                    "train/global_step": line.to_step,
                    "watchdog/rollbacks": line.rollbacks,
                    "watchdog/learning_rate": line.learning_rate,
                }
            )
        elif isinstance(line, lines.Resumed | lines.BatchSize | lines.Started):
            for key, value in lines.fields(line).items():
                if _number(value) or isinstance(value, str):
                    self.run.summary[f"{line.kind.value}/{key}"] = value
        elif isinstance(line, lines.Finished):
            for key, value in line.metrics.items():
                self.run.summary[f"final/{key}"] = value

    def samples(self, step: int, rows: Sequence[Mapping[str, str]]) -> None:
        """One eval's samples as a new table (a logged table is immutable)."""
        if self.run is None or not rows:
            return
        import wandb

        data = [[step, r["input"], r["prediction"], r["label"]] for r in rows]
        table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=data)
        self.run.log({"train/global_step": step, "eval/samples": table})

    def finish(self, failure: str | None = None) -> None:
        """End the run: exit code 0, or 1 with the failure reason in its summary."""
        if self.run is None:
            return
        if failure is not None:
            self.run.summary["failure_reason"] = failure
        self.run.finish(exit_code=1 if failure is not None else 0)
        self.run = None


def open_run(
    plan: WandbPlan, fleet_run_id: str, directory: Path, config: Mapping[str, Any], settings: Any = None
) -> Any:
    """The planned W&B run, opened (online: continued if it exists) with its files under `directory`;
    `settings` are wandb.Settings. The trainer's and, for a run that never trained, the fleet's. The
    client is silenced through these settings, never through WANDB_SILENT in this process's environment,
    which every process it starts afterwards (a test's, a worker's) would inherit."""
    import wandb

    settings = settings if settings is not None else wandb.Settings()
    settings.silent = True
    return wandb.init(
        id=plan.run_id,
        project=plan.project,
        entity=plan.entity,
        name=plan.name or f"trainfleet {fleet_run_id}",
        group=plan.group,
        mode=plan.mode,
        dir=str(directory),
        resume="allow" if plan.mode == "online" else None,
        config=clean_config(config),
        settings=settings,
    )


def clean_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` for a W&B run: every value that looks like a credential, or sits under a key named like
    one (`hub_token`, `api_key`; not the tokenizer's `pad_token`), replaced by REDACTED."""
    return {str(k): _clean(v, _secret_key(str(k))) for k, v in config.items()}


def _secret_key(key: str) -> bool:
    lowered = key.lower()
    return lowered not in _TOKENIZER_KEYS and _SECRET_KEY.search(lowered) is not None


def _clean(value: Any, under_secret: bool) -> Any:
    if isinstance(value, Mapping):
        return {k: _clean(v, under_secret or _secret_key(str(k))) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v, under_secret) for v in value]
    if value is None or isinstance(value, bool):
        return value
    if (under_secret and str(value).strip()) or (isinstance(value, str) and _SECRET_VALUE.search(value)):
        return REDACTED
    return value


def log_lifecycle(run: Any, lifecycle: Sequence[Mapping[str, Any]]) -> None:
    """What happened before training (the plan's lifecycle) into the W&B `run`: a table of the events, and
    each event's numbers in the summary (`lifecycle/<event>/<key>`). Also used for axolotl's run."""
    import wandb

    rows = [[float(e.get("t", 0.0)), str(e.get("event", "")), _detail(e)] for e in lifecycle]
    if rows:
        run.log({"lifecycle/events": wandb.Table(columns=["t", "event", "detail"], data=rows)})
    for event in lifecycle:
        for key, value in event.items():
            if key not in ("t", "event") and _number(value):
                run.summary[f"lifecycle/{event['event']}/{key}"] = value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _detail(event: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("t", "event"))
