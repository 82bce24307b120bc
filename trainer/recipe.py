"""trainfleet's LoRA recipe: torch + transformers + peft, a plain training loop (no HF Trainer).

`run` trains one job in this process, either alone or as one Ray Train worker (`train_loop_per_worker`);
the loop is the same, `trainer.dist` hides the difference. Every worker loads the same data (the split is
deterministic) and trains on its shard of it (DistributedSampler); gradients meet in DDP. Rank 0 prints
the progress lines (`trainer.progress`) and writes every file.

Schedule: eval loss at step 0, every `eval_steps` and at the end; a STEP line every `logging_steps`
optimizer steps (and at the last); a checkpoint every `save_steps`. `max_steps` wins over `num_epochs`.
Gradients are clipped to norm 1.0 (the HF Trainer's default). Under Ray each checkpoint and the end are
reported with `ray.train.report`, which every worker calls at the same steps.

Resuming (trainer.resume): a run whose work_dir (or Ray) holds a checkpoint starts from it: weights,
optimizer, scheduler, RNG states, counters, and the data position (the same epoch's order, the micro
batches already consumed skipped); the total number of steps does not change. The first STEP line after a
resume averages only the steps after it. Rollbacks: trainer.watchdog; auto_find_batch_size:
trainer.batch_size; test hooks: trainer.faults.

This module holds the entry points and the loop (steps, evaluation, checkpoints, rollbacks); building a
worker's model, data, optimizer and resume point before it is trainer.recipe_setup's.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, TypedDict

from trainer import dist, extras, faults, hub_checkpoints, lines, outputs, precision, samples, stopnotice
from trainer.config import TrainJob
from trainer.data import IGNORE_INDEX
from trainer.faults import InjectedCrash
from trainer.outputs import Metrics, TrainerState
from trainer.recipe_setup import RunSetup, plan_steps
from trainer.watchdog import LR_FACTOR, Reason, Trip, scale_learning_rate

MAX_GRAD_NORM = 1.0


class LoopConfig(TypedDict):
    """Ray's `train_loop_config`: plain JSON data (picklable as it is); workers rebuild the job from it."""

    job: dict[str, Any]  # TrainJob.model_dump(mode="json")
    model_path: str
    base_dir: str


def loop_config(job: TrainJob, model_path: Path, base_dir: Path) -> LoopConfig:
    """The `train_loop_config` the entrypoint hands Ray (plain JSON data; workers rebuild the job)."""
    return {"job": job.model_dump(mode="json"), "model_path": str(model_path), "base_dir": str(base_dir)}


def train_loop_per_worker(loop_cfg: LoopConfig) -> None:
    """Ray Train's worker function: `run` under Ray with the job from `loop_config`."""
    job = TrainJob.model_validate(loop_cfg["job"])
    run(job, Path(loop_cfg["model_path"]), base_dir=Path(loop_cfg["base_dir"]), under_ray=True)


def run(job: TrainJob, model_path: Path, *, base_dir: Path | None = None, under_ray: bool = False) -> Metrics:
    """Train `job` on the base model at `model_path` and return the final metrics (on every rank).

    Relative dataset paths are resolved against `base_dir` (default: the working directory). Rank 0
    writes the results into `job.output_dir` and checkpoints under `job.work_dir`/checkpoints. Raises
    DatasetError for unreadable data and TrainingFailed when the loss watchdog gives up.

    Metrics: eval_loss_first / eval_loss (token-weighted, None without an eval set), train_loss (mean of
    the step losses), global_step, total_steps, epoch, train_runtime_s (from this worker's start, loading
    included), train_examples, eval_examples, dropped_examples (no label left after truncation),
    num_workers, trainable_params, total_params.
    """
    state = _Run(job, model_path, base_dir, under_ray)
    state.tracker.start()
    state.stop.install()
    try:
        metrics = state.train()
    except BaseException as exc:
        state.tracker.finish(failure=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        state.stop.restore()
    state.tracker.finish()
    return metrics


def summed_loss(
    module: Any, batch: dict[str, Any], autocast: Callable[[], AbstractContextManager[Any]]
) -> tuple[float, float]:
    """(the summed next-token loss, the number of trained tokens) of one collated batch on `module`'s
    device, its forward under `autocast`: the parts of the token-weighted eval loss (labels at IGNORE_INDEX
    count for nothing). bench/trainer.py scores the other trainers' models with it too."""
    import torch

    labels = batch["labels"][:, 1:]
    with autocast():
        logits = module(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return float(loss), float((labels != IGNORE_INDEX).sum())


class _Run(RunSetup):
    """One worker's training run; `train` is the loop."""

    def train(self) -> Metrics:
        cfg, w = self.config, self.worker
        nodes = dist.gather_text(w.node_id, w)  # where each rank runs, as Ray says (a collective)
        self.say(
            lines.Started(
                total_steps=self.total,
                num_workers=w.world_size,
                nodes=nodes,
                num_nodes=len(set(nodes)),
                train_examples=len(self.data.train),
                eval_examples=len(self.data.eval),
                python=sys.executable,  # the node environment's interpreter, which trains (rank 0's)
                precision=self.precision.dtype or "float32",
            )
        )
        if (where := self.resumed) is not None:
            self.say(where.line(self.total))
        else:
            self.pos.eval_loss_first = self.evaluate()
        self.model.train()
        while self.pos.step < self.total:
            self.train_epoch()
        final_eval = self.evaluate()
        loss_sum, steps = dist.all_reduce_sum([self.pos.train_loss_sum, float(self.pos.step)], w)
        metrics: Metrics = {
            "eval_loss_first": self.pos.eval_loss_first,
            "eval_loss": final_eval,
            "train_loss": loss_sum / max(steps, 1.0),
            "global_step": self.pos.step,
            "total_steps": self.total,
            "epoch": round(self.pos.epoch, 4),
            "train_runtime_s": round(time.monotonic() - self.started, 3),
            "train_examples": len(self.data.train),
            "eval_examples": len(self.data.eval),
            "dropped_examples": self.data.dropped,
            "num_workers": w.world_size,
            "trainable_params": self.trainable,
            "total_params": self.total_params,
            "precision": self.precision.dtype or "float32",
        }
        output_dir = Path(self.job.output_dir)
        if w.is_main:
            outputs.write_results(
                output_dir,
                peft_model=self.peft_model,
                tokenizer=self.tokenizer,
                config=cfg,
                metrics=metrics,
                run_id=self.job.run_id,
                target_modules=self.targets,
                job_yaml=self.job.job_yaml,
                wandb_url=self.tracker.url,
            )
        dist.report(w, metrics)
        self.say(lines.Finished(metrics=dict(metrics), output_dir=str(output_dir)))
        return metrics

    def train_epoch(self) -> None:
        """Train from the current position to the end of its epoch, the last step, or a rollback."""
        cfg, pos, rank = self.config, self.pos, self.worker.rank
        gas, n_batches, epoch = cfg.gradient_accumulation_steps, self.batches_per_epoch, pos.epoch_index
        self.sampler.set_epoch(epoch)
        self.sampler.skip = pos.batches_done * cfg.micro_batch_size  # resumed: the batches already done
        accumulated = 0.0
        for i, batch in enumerate(self.train_loader, start=pos.batches_done):
            window_start = (i // gas) * gas
            window = min(gas, n_batches - window_start)  # the last window of an epoch may be short
            last = i - window_start == window - 1
            wrapped = self.model is not self.peft_model  # DDP: all-reduce only on a window's last batch
            sync = self.model.no_sync() if wrapped and not last else nullcontext()
            inject = self.faults.nan_at(pos.step + 1, rank) and pos.step + 1 not in self.nan_done
            with sync:
                with self.precision.autocast():
                    loss = self.model(**self.to_device(batch)).loss
                if inject:
                    loss = loss * math.nan
                value = float(loss.detach())
                scaled = loss / window
                if not math.isfinite(value):  # NaN gradients here make the average NaN on every rank
                    scaled = scaled * math.nan
                precision.backward(scaled, self.scaler)
            accumulated += value / window
            if not last:
                continue
            if inject and not self.faults.nan_every_step():
                self.nan_done.add(pos.step + 1)
            step = self.optimizer_step(math.isfinite(accumulated))
            if step.diverged:
                self.roll_back(self.watchdog.non_finite(pos.step + 1, accumulated, step.grad_norm))
                return
            pos.batches_done = i + 1
            pos.epoch = epoch + (i + 1) / n_batches
            if step.skipped:  # fp16 overflow: the scaler lowered its scale; the data moves on, the step not
                accumulated = 0.0
                continue
            self.window.append(accumulated)
            pos.train_loss_sum += accumulated
            accumulated = 0.0
            if self.after_step():
                return  # rolled back: the loop starts again from the restored position
            self.stop_if_told()
            if self.faults.crash_after(pos.step, rank):
                raise InjectedCrash(f"{faults.ENV_VAR} asked for a crash after step {pos.step}")
            if pos.step >= self.total:
                return
        pos.epoch_index, pos.batches_done = epoch + 1, 0

    def optimizer_step(self, loss_finite: bool) -> precision.StepResult:
        """Unscale (fp16), clip and apply the gradients (trainer.precision.clip_and_step): applied, skipped
        (an fp16 overflow the scaler handles) or diverged (the caller rolls back). Whether the loss was finite
        on every worker is asked (a collective) only when an fp16 step overflowed, which every worker sees,
        as the gradients are all-reduced."""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        step = precision.clip_and_step(
            self.optimizer,
            params,
            MAX_GRAD_NORM,
            self.scaler,
            lambda: dist.all_true(loss_finite, self.worker),
        )
        if step.applied:
            self.scheduler.step()
            self.pos.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        return step

    def after_step(self) -> bool:
        """Log, evaluate and checkpoint as scheduled (every eval_steps / save_steps, or evals_per_epoch /
        saves_per_epoch times an epoch: trainer.extras.interval); True when the watchdog rolled back."""
        cfg, step = self.config, self.pos.step
        per_epoch, _ = plan_steps(self.batches_per_epoch, cfg)
        eval_every = extras.interval(cfg.eval_steps, cfg.evals_per_epoch, per_epoch)
        save_every = extras.interval(cfg.save_steps, cfg.saves_per_epoch, per_epoch)
        if step % cfg.logging_steps == 0 or step == self.total:
            trip = self.log_step()
            if trip is not None:
                self.roll_back(trip)
                return True
        if eval_every and step % eval_every == 0 and step < self.total:
            self.evaluate()
            self.model.train()
        if save_every and step % save_every == 0:
            self.checkpoint()
        return False

    def log_step(self) -> Trip | None:
        """Emit the mean loss over all workers of the steps since the last STEP line (a collective), and
        show it to the watchdog."""
        total, count = dist.all_reduce_sum([sum(self.window), float(len(self.window))], self.worker)
        self.window = []
        loss = total / count
        lr = float(self.scheduler.get_last_lr()[0])
        self.say(
            lines.Step(
                step=self.pos.step,
                total_steps=self.total,
                loss=round(loss, 6),
                learning_rate=lr,
                epoch=round(self.pos.epoch, 4),
            )
        )
        return self.watchdog.logged(self.pos.step, loss)

    def roll_back(self, trip: Trip) -> None:
        """Go back to the anchor with the learning rate halved once more (every rank, at the same step);
        TrainingFailed once loss_watchdog_max_rollbacks are spent."""
        self.watchdog.allow(trip, self.pos.rollbacks)
        before = self.pos
        self.pos = self.restore(self.anchor)
        self.pos.rollbacks = before.rollbacks + 1
        self.pos.eval_loss_first, self.pos.eval_loss = before.eval_loss_first, before.eval_loss
        self.pos.lr_scale = before.lr_scale * LR_FACTOR
        scale_learning_rate(self.optimizer, self.scheduler, self.pos.lr_scale / self.anchor.position.lr_scale)
        self.window = []
        self.model.train()
        self.say(
            lines.Rollback(
                step=trip.step,
                to_step=self.pos.step,
                reason=trip.reason.value,
                loss=round(trip.loss, 6) if trip.reason == Reason.HIGH_LOSS else None,
                learning_rate=float(self.scheduler.get_last_lr()[0]),
                rollbacks=self.pos.rollbacks,
            )
        )

    def evaluate(self) -> float | None:
        """Token-weighted mean loss over the whole eval set (all ranks' shards); None without one."""
        if not self.data.eval:
            return None
        import torch

        module = self.peft_model  # never the DDP wrapper: ranks may run different numbers of batches
        module.eval()
        loss_sum, tokens = 0.0, 0.0
        with torch.no_grad():
            for batch in self.eval_loader:
                batch_sum, batch_tokens = summed_loss(module, self.to_device(batch), self.precision.autocast)
                loss_sum, tokens = loss_sum + batch_sum, tokens + batch_tokens
        loss_sum, tokens = dist.all_reduce_sum([loss_sum, tokens], self.worker)
        eval_loss = self.pos.eval_loss = loss_sum / max(tokens, 1.0)
        self.say(lines.Eval(step=self.pos.step, eval_loss=round(eval_loss, 6)))
        rows_asked = samples.table_size(self.config.eval_table_size, self.job.log_eval)
        if self.worker.is_main and rows_asked:
            picked = self.data.eval[:rows_asked]
            with self.precision.autocast():
                rows = samples.generate(
                    module, self.tokenizer, picked, self.config.eval_max_new_tokens, self.worker.device
                )
            samples.append(Path(self.job.output_dir), self.pos.step, rows)
            self.tracker.samples(self.pos.step, rows)
        return eval_loss

    def stop_if_told(self) -> None:
        """On a stop notice (trainer.stopnotice; every worker agrees, one collective), keep a checkpoint at
        this step unless it was just saved, and wait for the machine to go: the run resumes from it."""
        why = self.stop.why()
        if dist.all_true(why is None, self.worker):
            return
        started = time.monotonic()
        if self.saved_at != self.pos.step:
            self.checkpoint()
        said = why or "another worker's stop notice"
        stopnotice.wait_for_the_end(
            self.stop, self.pos.step, said, time.monotonic() - started, self.worker.is_main
        )

    def checkpoint(self) -> None:
        """Make the current state the anchor of rollbacks (every rank); rank 0 saves it as step-N under
        work_dir/checkpoints, keeping the newest save_total_limit there; report it to Ray (every rank)."""
        cfg, w = self.config, self.worker
        path = Path(self.job.work_dir) / outputs.CHECKPOINTS_DIR / f"step-{self.pos.step}"
        self.anchor = self.capture()
        (loss_sum,) = dist.all_reduce_sum([self.pos.train_loss_sum], w)
        state: TrainerState = {
            **self.anchor.position.to_state(),
            "train_loss_sum": loss_sum / w.world_size,  # each rank's share, as every rank resumes with it
            "total_steps": self.total,
            "micro_batch_size": cfg.micro_batch_size,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
            "world_size": w.world_size,
        }
        hub = None
        if w.is_main:
            outputs.save_checkpoint(path, self.peft_model, self.anchor, state, cfg.base_model)
            if cfg.save_total_limit:  # never this one: the rollback anchor's copy, what a resume starts from
                outputs.prune_checkpoints(path, cfg.save_total_limit)
            hub = hub_checkpoints.push(path, self.job)
        reported: dist.CheckpointMetrics = {"step": self.pos.step, "eval_loss": self.pos.eval_loss}
        dist.report(w, reported, checkpoint_dir=path)
        self.saved_at = self.pos.step
        self.say(lines.Checkpoint(step=self.pos.step, path=str(path), hub=hub))
