"""The W&B run of a run that ended before its trainer opened it: the fleet writes the story itself.

The trainer (either one) opens the run's W&B run when training starts and writes what happened before
(the plan's lifecycle), training, and its own failure. A run that fails or is cancelled earlier (no node,
a broken node, a failed `entry`, a missing dataset) would otherwise never reach W&B, although those are the
failures the proof of concept started W&B early to debug. So when such a run ends, the fleet opens the
planned run (same id: online, the trainer would have continued it) and writes the lifecycle so far, the
failure reason and its message (credentials taken out), and finishes it with exit code 1.

Best effort: W&B being unreachable never changes how the run ends (a warning in the worker's log).
"""

from __future__ import annotations

import logging
from pathlib import Path

from core.errors import FailureReason
from jobs.redact import redact_values
from state.models import Run
from state.stages import Stage
from trainer.tracking import log_lifecycle, open_run
from workers import context, wandb_plan
from workers.node_job import known_secrets

log = logging.getLogger("trainfleet.workers")
INIT_TIMEOUT_S = 60.0


def record_early_end(ctx: context.Context, run: Run, reason: FailureReason | None, message: str) -> None:
    """Write the W&B run of `run`, which ended (`reason`, `message`) before its train stage began; nothing
    when the job has no W&B run or its trainer was started (it writes its own)."""
    if Stage.TRAIN.value in run.ray_jobs:
        return
    plan = wandb_plan.for_trainer(ctx, run)
    if plan is None:
        return
    try:
        import wandb

        key = ctx.provider_context.credentials.get("WANDB_API_KEY")
        settings = wandb.Settings(
            init_timeout=INIT_TIMEOUT_S,
            api_key=key.get_secret_value() if key is not None else None,
            base_url=ctx.settings.wandb_base_url,
        )
        config = {"fleet_run_id": run.run_id, "trainer": run.spec.train.trainer}
        wb = open_run(plan, run.run_id, Path(run.run_dir), config, settings)
        try:
            log_lifecycle(wb, plan.lifecycle)
            wb.summary["failure_reason"] = reason.value if reason is not None else "CANCELLED"
            wb.summary["failure_message"] = redact_values(message[-1500:], known_secrets(ctx))
            wb.summary["ended_in_stage"] = _stage_of(run)
        finally:
            wb.finish(exit_code=1)
    except Exception as exc:  # noqa: BLE001 - W&B is a report, never a reason for the run to end otherwise
        log.warning("run %s: could not write its W&B run %s: %s", run.run_id, plan.run_id, exc)


def _stage_of(run: Run) -> str:
    stage = run.state.stage
    return stage.value if stage is not None else run.state.value
