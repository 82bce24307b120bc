"""What trainfleet's axolotl plugin adds to axolotl's HF Trainer: a `TrainerCallback` (transformers only, so
it loads without axolotl) that makes an axolotl run look like a builtin one to the fleet.

On the world's process zero it prints the builtin recipe's progress lines (STARTED, RESUMED, STEP, EVAL,
CHECKPOINT; trainer.axolotl_run prints FINISHED), writes eval samples as trainer.samples does (the first
`eval_table_size` eval rows, default 4: prompt, greedy prediction, label; skipped when the model is sharded
by FSDP or DeepSpeed, where one rank alone cannot generate), and writes the lifecycle the fleet planned into
the W&B run axolotl opened. The loss watchdog (axolotl's `loss_watchdog_threshold` and
`loss_watchdog_patience`, default 3; any NaN or infinite logged loss as well) runs on every rank, since
every rank sees the same logged loss and all must stop together; it stops training and records why in the
result file, so that trainer.axolotl_run fails the run instead of passing a broken adapter on. At the end
the final metrics go there too. Told the machine is going (trainer.stopnotice: SIGTERM, the node's stop
notice), every process saves a checkpoint at that step, then waits to be killed with the machine.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from trainer import lines, samples, stopnotice, tracking
from trainer.axolotl_run import RESULT_ENV, RESULT_FILE
from trainer.config import TrainJob
from trainer.data import Example
from trainer.progress import ENV_VAR
from trainer.stopnotice import StopNotice

DEFAULT_TABLE_SIZE = 4
DEFAULT_MAX_NEW_TOKENS = 48


def job_from_env(environ: Mapping[str, str]) -> TrainJob | None:
    """The TrainJob trainer.axolotl_run (or the fleet's Ray job) put in the environment, if any."""
    text = environ.get(ENV_VAR)
    if not text:
        return None
    try:
        return TrainJob.from_env(text).on_node(environ)
    except ValueError:
        return None


class FleetCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
    """Progress lines, loss watchdog, eval samples and final metrics for an axolotl run (module docstring)."""

    def __init__(
        self, trainer: Any, cfg: Mapping[str, Any], job: TrainJob | None, result: Path | None
    ) -> None:
        self.trainer, self.job, self.result = trainer, job, result
        threshold = cfg.get("loss_watchdog_threshold")
        self.threshold = float(threshold) if threshold is not None else None
        self.patience = int(cfg.get("loss_watchdog_patience") or 3)
        self.streak = 0
        written = job.config.model_dump(exclude_none=True) if job is not None else {}
        size = written.get("eval_table_size", cfg.get("eval_table_size") or DEFAULT_TABLE_SIZE)
        self.table_size = samples.table_size(int(size or 0), job.log_eval if job is not None else None)
        self.max_new_tokens = int(cfg.get("eval_max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
        self.sharded = bool(cfg.get("fsdp") or cfg.get("fsdp_config") or cfg.get("deepspeed"))
        self.state: dict[str, Any] = {"started": False}
        self.stop = StopNotice(os.environ)  # the machine is going: a checkpoint at this step (on_step_end)
        self.stopping: tuple[str, float] | None = None  # why, and since when

    @classmethod
    def from_env(cls, trainer: Any, cfg: Mapping[str, Any], environ: Mapping[str, str]) -> FleetCallback:
        """The callback for this process: the job and the result file from trainer.axolotl_run's environment
        (a Ray Train worker, without that variable, finds the result file under the job's work_dir)."""
        job = job_from_env(environ)
        named = environ.get(RESULT_ENV)
        result = Path(named) if named else (Path(job.work_dir) / RESULT_FILE if job is not None else None)
        return cls(trainer, cfg, job, result)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stop.install()  # in axolotl's own process, while it trains (restored at on_train_end)
        if not state.is_world_process_zero:
            return
        started = lines.Started(
            total_steps=state.max_steps,
            num_workers=args.world_size,
            train_examples=_size(getattr(self.trainer, "train_dataset", None)),
            eval_examples=_size(getattr(self.trainer, "eval_dataset", None)),
            python=sys.executable,
        )
        lines.emit(started)
        if state.global_step > 0:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            resumed = lines.Resumed(
                step=state.global_step, total_steps=state.max_steps, path=str(path), source="local"
            )
            lines.emit(resumed)
        self.state["started"] = True
        self._write()
        self._lifecycle()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kw: Any
    ) -> None:
        logs = logs or {}
        main = state.is_world_process_zero
        if "loss" in logs:
            loss = float(logs["loss"])
            loss = round(loss, 6) if math.isfinite(loss) else loss  # as the STEP line and the watchdog say it
            if main:
                step = lines.Step(
                    step=state.global_step,
                    total_steps=state.max_steps,
                    loss=loss,
                    learning_rate=_float(logs.get("learning_rate")),
                    epoch=round(float(state.epoch or 0.0), 4),
                )
                lines.emit(step)
            if self.watch(state.global_step, loss):
                control.should_training_stop = True
        if "eval_loss" in logs and main:
            lines.emit(lines.Eval(step=state.global_step, eval_loss=round(float(logs["eval_loss"]), 6)))

    def watch(self, step: int, loss: float) -> bool:
        """Note one logged loss; True (and the trip recorded) when training must stop."""
        if math.isfinite(loss) and (self.threshold is None or loss <= self.threshold):
            self.streak = 0
            return False
        self.streak += 1
        if math.isfinite(loss) and self.streak < self.patience:
            return False
        reason = "high_loss" if math.isfinite(loss) else "non_finite"
        trip = {"reason": reason, "loss": loss, "threshold": self.threshold, "patience": self.patience}
        self.state["watchdog"] = {**trip, "step": step}
        print(
            f"trainer: loss watchdog: stopping training at step {step} ({reason}, loss {loss})",
            file=sys.stderr,
        )
        self._write()
        return True

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.table_size <= 0:
            return
        if self.sharded:
            print("trainer: warning: no eval samples: the model is sharded (FSDP/DeepSpeed)", file=sys.stderr)
            self.table_size = 0
            return
        try:
            rows = self.eval_samples()
        except Exception as exc:  # noqa: BLE001 - samples are a courtesy; training goes on without them
            print(f"trainer: warning: no eval samples: {type(exc).__name__}: {exc}", file=sys.stderr)
            self.table_size = 0
            return
        samples.append(Path(args.output_dir), state.global_step, rows)

    def eval_samples(self) -> list[dict[str, str]]:
        """Greedy predictions for the first eval rows (axolotl's: input_ids, labels -100 over the prompt)."""
        dataset = self.trainer.eval_dataset
        if dataset is None or _size(dataset) == 0:
            return []
        picked = [dataset[i] for i in range(min(self.table_size, len(dataset)))]
        examples = [Example([int(t) for t in r["input_ids"]], [int(t) for t in r["labels"]]) for r in picked]
        model = self.trainer.model
        device = next(model.parameters()).device
        return samples.generate(model, self.trainer.processing_class, examples, self.max_new_tokens, device)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Told the machine is going (trainer.stopnotice; every process agrees): save at this step."""
        why = self.stop.why()
        if self.stopping is None and _anywhere(why is not None):
            self.stopping = (why or "another process's stop notice", time.monotonic())
            control.should_save = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            lines.emit(lines.Checkpoint(step=state.global_step, path=str(path)))
        if self.stopping is not None:  # kept: wait to be killed with the machine (trainer.stopnotice)
            pushing = getattr(self.trainer, "push_in_progress", None)  # HF pushes in the background
            if pushing is not None:
                pushing.wait_until_done()  # the checkpoint on the hub before the node is told it may go
            why, since = self.stopping
            stopnotice.wait_for_the_end(
                self.stop, state.global_step, why, time.monotonic() - since, state.is_world_process_zero
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stop.restore()
        if not state.is_world_process_zero:
            return
        history = list(state.log_history)
        evals = [float(h["eval_loss"]) for h in history if "eval_loss" in h]
        final: Mapping[str, Any] = next((h for h in reversed(history) if "train_loss" in h), {})
        self.state["metrics"] = {
            "eval_loss_first": evals[0] if evals else None,
            "eval_loss": evals[-1] if evals else None,
            "train_loss": _float(final.get("train_loss")),
            "global_step": state.global_step,
            "total_steps": state.max_steps,
            "epoch": round(float(state.epoch or 0.0), 4),
            "train_runtime_s": _float(final.get("train_runtime")),
            "train_examples": _size(getattr(self.trainer, "train_dataset", None)),
            "eval_examples": _size(getattr(self.trainer, "eval_dataset", None)),
            "num_workers": args.world_size,
        }
        self._write()

    def _lifecycle(self) -> None:
        """The fleet's lifecycle (provision, download, price) into the W&B run axolotl opened, if any."""
        plan = self.job.wandb if self.job is not None else None
        wandb = sys.modules.get("wandb")
        if plan is None or not plan.lifecycle or wandb is None or getattr(wandb, "run", None) is None:
            return
        tracking.log_lifecycle(wandb.run, plan.lifecycle)

    def _write(self) -> None:
        """The result file, replaced whole (trainer.axolotl_run reads it once axolotl has exited)."""
        if self.result is None:
            return
        self.result.parent.mkdir(parents=True, exist_ok=True)
        partial = self.result.with_name(f".{self.result.name}.{os.getpid()}")
        partial.write_text(json.dumps(self.state, indent=2) + "\n", encoding="utf-8")
        partial.replace(self.result)


def _size(dataset: Any) -> int | None:
    try:
        return len(dataset) if dataset is not None else None
    except TypeError:
        return None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _anywhere(flag: bool) -> bool:
    """Whether `flag` holds in any process of the run (one collective when torch.distributed runs, so every
    process saves at the same step); `flag` itself in a single process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    import torch

    value = torch.tensor([1.0 if flag else 0.0])
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)
