"""trainfleet's LoRA recipe: torch + transformers + peft, a plain training loop (no HF Trainer).

`run` trains one job in this process, either alone or as one Ray Train worker (`train_loop_per_worker`);
the loop is the same, `trainer.dist` hides the difference. Every worker loads the same data (the split is
deterministic) and trains on its shard of it (DistributedSampler); gradients meet in DDP. Rank 0 prints
the progress lines (`trainer.progress`) and writes every file.

Schedule: eval loss at step 0, every `eval_steps` and at the end; a STEP line every `logging_steps`
optimizer steps (and at the last); a checkpoint every `save_steps`. `max_steps` wins over `num_epochs`.
Gradients are clipped to norm 1.0 (the HF Trainer's default). Under Ray each checkpoint and the end are
reported with `ray.train.report`, which every worker calls at the same steps.
"""

from __future__ import annotations

import math
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from trainer import dist, outputs
from trainer.config import TrainConfig, TrainJob
from trainer.data import IGNORE_INDEX, Collator, prepare
from trainer.errors import TrainingFailed
from trainer.progress import Kind, emit

MAX_GRAD_NORM = 1.0
DEFAULT_TARGETS = ("q_proj", "v_proj")


def lora_targets(model: Any, config: TrainConfig) -> list[str]:
    """The module names LoRA adapts: `lora_target_modules`, plus every linear layer but the output head
    when `lora_target_linear`; q_proj and v_proj when neither is set."""
    import torch

    names = set(config.lora_target_modules or [])
    if config.lora_target_linear:
        head = model.get_output_embeddings()
        names |= {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head
        }
    return sorted(names) or list(DEFAULT_TARGETS)


def plan_steps(batches_per_epoch: int, config: TrainConfig) -> tuple[int, int]:
    """(optimizer steps per epoch, total optimizer steps) for one worker's `batches_per_epoch`."""
    per_epoch = max(1, math.ceil(batches_per_epoch / config.gradient_accumulation_steps))
    total = config.max_steps if config.max_steps is not None else math.ceil(config.num_epochs * per_epoch)
    return per_epoch, max(1, total)


def warmup_steps(config: TrainConfig, total: int) -> int:
    """`warmup_steps`, or `warmup_ratio` of `total` rounded up, or 0."""
    if config.warmup_steps is not None:
        return config.warmup_steps
    return math.ceil((config.warmup_ratio or 0.0) * total)


def build_optimizer(params: list[Any], config: TrainConfig, device: Any) -> Any:
    """torch AdamW for the adamw_* names (fused on GPU for adamw_torch_fused), SGD for sgd."""
    import torch

    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    fused = config.optimizer == "adamw_torch_fused" and device.type == "cuda"
    return torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused)


def load_lora_model(model_path: Path, config: TrainConfig) -> tuple[Any, list[str]]:
    """The base model from `model_path` (float32) wrapped in a fresh LoRA adapter, and its target names."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_path), dtype="float32")
    targets = lora_targets(base, config)
    alpha = config.lora_alpha
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=int(alpha) if float(alpha).is_integer() else alpha,
        lora_dropout=config.lora_dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, lora), targets


def loop_config(job: TrainJob, model_path: Path, base_dir: Path) -> dict[str, Any]:
    """The `train_loop_config` the entrypoint hands Ray (plain JSON data; workers rebuild the job)."""
    return {"job": job.model_dump(mode="json"), "model_path": str(model_path), "base_dir": str(base_dir)}


def train_loop_per_worker(loop_cfg: dict[str, Any]) -> None:
    """Ray Train's worker function: `run` under Ray with the job from `loop_config`."""
    job = TrainJob.model_validate(loop_cfg["job"])
    run(job, Path(loop_cfg["model_path"]), base_dir=Path(loop_cfg["base_dir"]), under_ray=True)


def run(
    job: TrainJob, model_path: Path, *, base_dir: Path | None = None, under_ray: bool = False
) -> dict[str, Any]:
    """Train `job` on the base model at `model_path` and return the final metrics (on every rank).

    Relative dataset paths are resolved against `base_dir` (default: the working directory). Rank 0
    writes the results into `job.output_dir` and checkpoints under `job.work_dir`/checkpoints. Raises
    DatasetError for unreadable data and TrainingFailed when the loss stops being finite.

    Metrics: eval_loss_first / eval_loss (token-weighted, None without an eval set), train_loss (mean of
    the step losses), global_step, total_steps, epoch, train_runtime_s (from this worker's start, loading
    included), train_examples, eval_examples, dropped_examples (no label left after truncation),
    num_workers, trainable_params, total_params.
    """
    return _Run(job, model_path, base_dir, under_ray).train()


class _Run:
    """The state of one worker's training run; `train` is the loop."""

    def __init__(self, job: TrainJob, model_path: Path, base_dir: Path | None, under_ray: bool) -> None:
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        from transformers import AutoTokenizer, get_scheduler
        from transformers.utils import logging as hf_logging

        self.started = time.monotonic()
        self.job, self.config = job, job.config
        cfg = self.config
        hf_logging.disable_progress_bar()
        self.worker = dist.current_worker(job.use_gpu, under_ray)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # same LoRA init on every rank

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        pad_id = self.tokenizer.pad_token_id
        collate = Collator(self.tokenizer.eos_token_id if pad_id is None else pad_id)
        self.data = prepare(cfg, self.tokenizer, base_dir)
        peft_model, self.targets = load_lora_model(model_path, cfg)
        self.trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        self.total_params = sum(p.numel() for p in peft_model.parameters())
        self.model = dist.prepare_model(peft_model, self.worker)
        self.peft_model = dist.unwrap(self.model)

        w = self.worker
        self.sampler = DistributedSampler(
            self.data.train, num_replicas=w.world_size, rank=w.rank, shuffle=True, seed=cfg.seed
        )
        self.train_loader = DataLoader(
            self.data.train, batch_size=cfg.micro_batch_size, sampler=self.sampler, collate_fn=collate
        )
        # Eval shards without padding (each example counted once); losses are summed over all ranks.
        shard = self.data.eval[w.rank :: w.world_size]
        self.eval_loader = DataLoader(shard, batch_size=cfg.micro_batch_size, collate_fn=collate)
        _, self.total = plan_steps(len(self.train_loader), cfg)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(params, cfg, w.device)
        self.scheduler = get_scheduler(
            cfg.lr_scheduler,
            self.optimizer,
            num_warmup_steps=warmup_steps(cfg, self.total),
            num_training_steps=self.total,
        )
        self.step, self.epoch = 0, 0.0
        self.eval_loss: float | None = None
        self.window: list[float] = []  # micro-batch-averaged losses of the steps since the last STEP line
        self.step_losses_sum = 0.0

    def say(self, kind: Kind, **data: Any) -> None:
        if self.worker.is_main:
            emit(kind, **data)

    def train(self) -> dict[str, Any]:
        cfg, w = self.config, self.worker
        self.say(
            Kind.STARTED,
            total_steps=self.total,
            num_workers=w.world_size,
            train_examples=len(self.data.train),
            eval_examples=len(self.data.eval),
        )
        first_eval = self.evaluate()
        self.model.train()
        epoch = 0
        while self.step < self.total:
            self.sampler.set_epoch(epoch)
            self.train_epoch(epoch)
            epoch += 1
        if self.window:
            self.log_step()
        final_eval = self.evaluate()
        loss_sum, steps = dist.all_reduce_sum([self.step_losses_sum, float(self.step)], w)
        metrics: dict[str, Any] = {
            "eval_loss_first": first_eval,
            "eval_loss": final_eval,
            "train_loss": loss_sum / max(steps, 1.0),
            "global_step": self.step,
            "total_steps": self.total,
            "epoch": round(self.epoch, 4),
            "train_runtime_s": round(time.monotonic() - self.started, 3),
            "train_examples": len(self.data.train),
            "eval_examples": len(self.data.eval),
            "dropped_examples": self.data.dropped,
            "num_workers": w.world_size,
            "trainable_params": self.trainable,
            "total_params": self.total_params,
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
            )
        dist.report(w, metrics)
        self.say(Kind.FINISHED, metrics=metrics, output_dir=str(output_dir))
        return metrics

    def train_epoch(self, epoch: int) -> None:
        """One pass over this worker's shard, stopping early at the last step."""
        cfg = self.config
        gas, n_batches = cfg.gradient_accumulation_steps, len(self.train_loader)
        accumulated = 0.0
        for i, batch in enumerate(self.train_loader):
            window_start = (i // gas) * gas
            window = min(gas, n_batches - window_start)  # the last window of an epoch may be short
            last = i - window_start == window - 1
            wrapped = self.model is not self.peft_model  # DDP: all-reduce only on a window's last batch
            sync = self.model.no_sync() if wrapped and not last else nullcontext()
            with sync:
                loss = self.model(**self.to_device(batch)).loss
                (loss / window).backward()
            accumulated += float(loss.detach()) / window
            if not last:
                continue
            self.optimizer_step()
            self.epoch = epoch + (i + 1) / n_batches
            self.window.append(accumulated)
            self.step_losses_sum += accumulated
            accumulated = 0.0
            self.after_step()
            if self.step >= self.total:
                return

    def optimizer_step(self) -> None:
        import torch

        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1

    def after_step(self) -> None:
        cfg = self.config
        if self.step % cfg.logging_steps == 0:
            self.log_step()
        if cfg.eval_steps and self.step % cfg.eval_steps == 0 and self.step < self.total:
            self.evaluate()
            self.model.train()
        if cfg.save_steps and self.step % cfg.save_steps == 0:
            self.checkpoint()

    def log_step(self) -> None:
        """Emit the mean loss over all workers of the steps since the last STEP line (a collective)."""
        total, count = dist.all_reduce_sum([sum(self.window), float(len(self.window))], self.worker)
        self.window = []
        loss = total / count
        if not math.isfinite(loss):
            raise TrainingFailed(f"the training loss is {loss} at step {self.step}")
        lr = float(self.scheduler.get_last_lr()[0])
        self.say(
            Kind.STEP,
            step=self.step,
            total_steps=self.total,
            loss=round(loss, 6),
            learning_rate=lr,
            epoch=round(self.epoch, 4),
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
                batch = self.to_device(batch)
                labels = batch.pop("labels")[:, 1:]
                logits = module(**batch).logits[:, :-1].float()
                loss_sum += float(
                    torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]),
                        labels.reshape(-1),
                        ignore_index=IGNORE_INDEX,
                        reduction="sum",
                    )
                )
                tokens += float((labels != IGNORE_INDEX).sum())
        loss_sum, tokens = dist.all_reduce_sum([loss_sum, tokens], self.worker)
        self.eval_loss = loss_sum / max(tokens, 1.0)
        self.say(Kind.EVAL, step=self.step, eval_loss=round(self.eval_loss, 6))
        return self.eval_loss

    def checkpoint(self) -> None:
        """Save step-N under work_dir/checkpoints on rank 0; report it to Ray (every rank)."""
        path = Path(self.job.work_dir) / "checkpoints" / f"step-{self.step}"
        state = {"global_step": self.step, "epoch": self.epoch, "total_steps": self.total}
        if self.worker.is_main:
            outputs.save_checkpoint(
                path, self.peft_model, self.optimizer, self.scheduler, state, self.config.base_model
            )
        dist.report(self.worker, {"step": self.step, "eval_loss": self.eval_loss}, checkpoint_dir=path)
        self.say(Kind.CHECKPOINT, step=self.step, path=str(path))

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to(self.worker.device) for k, v in batch.items()}
