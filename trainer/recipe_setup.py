"""What one worker's training run is made of, built once before the loop (trainer.recipe) starts.

`RunSetup` loads the tokenizer, the data (`trainer.data`) and the base model with a fresh LoRA adapter
(`trainer.lora`, wrapped in DDP by `trainer.dist` when there are several workers), picks the micro batch
(auto_find_batch_size: `trainer.batch_size`), builds the sharded data loaders, the optimizer and the
learning-rate scheduler, and finds the checkpoint to resume from (`trainer.resume`), restoring it. It
also holds the helpers the loop shares: `say` (progress lines and tracking, rank 0 only), `capture` /
`restore` of a `Snapshot`, `to_device`. `plan_steps` and `warmup_steps` are the run's step arithmetic.
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainer import batch_size, dist, extras, faults, lines, precision, prepared, resume, snapshot
from trainer.config import TrainConfig, TrainJob
from trainer.data import Collator, split
from trainer.lora import build_optimizer, load_lora_model
from trainer.snapshot import Position, Snapshot
from trainer.stopnotice import StopNotice
from trainer.tracking import Tracker
from trainer.watchdog import Watchdog

if TYPE_CHECKING:
    import torch


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


class RunSetup:
    """The parts of one worker's training run and its position; trainer.recipe's `_Run` is the loop."""

    def __init__(self, job: TrainJob, model_path: Path, base_dir: Path | None, under_ray: bool) -> None:
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        from transformers import get_scheduler
        from transformers.utils import logging as hf_logging

        self.started = time.monotonic()
        if not isinstance(job.config, TrainConfig):  # axolotl's jobs run axolotl (trainer.axolotl_run)
            raise TypeError(f"the builtin recipe cannot run a trainer: {job.config.trainer} job")
        self.job, self.config = job, job.config
        cfg = self.config
        hf_logging.disable_progress_bar()
        self.worker = dist.current_worker(job.use_gpu, under_ray)
        precision.check_node(cfg, self.worker.device)  # what this node lacks, before anything is loaded
        self.tracker = Tracker(job, self.worker.is_main)
        self.faults = faults.from_env(os.environ)
        self.stop = StopNotice(os.environ)  # the machine is being taken back: keep a checkpoint (recipe)
        self.saved_at: int | None = None  # the step of the last checkpoint this process saved
        self.nan_done: set[int] = set()  # steps whose injected NaN has fired (once per process)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # same LoRA init on every rank

        added = self.read_data(model_path, base_dir)
        precision.apply_tf32(cfg)
        self.precision = precision.decide(cfg, self.worker.device)
        self.scaler = self.precision.grad_scaler()  # fp16 only
        peft_model, self.targets = load_lora_model(
            model_path, cfg, self.precision, self.worker.device, vocab_size=len(self.tokenizer)
        )
        extras.check_modules_to_save(peft_model, added, cfg)
        self.trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        self.total_params = sum(p.numel() for p in peft_model.parameters())
        self.model = dist.prepare_model(peft_model, self.worker)
        self.peft_model = dist.unwrap(self.model)

        w = self.worker
        self.resumed = resume.find(Path(job.work_dir), w)
        shard = DistributedSampler(
            self.data.train, num_replicas=w.world_size, rank=w.rank, shuffle=True, seed=cfg.seed
        )
        self.config = cfg = self.choose_batch_size(cfg, len(shard))
        self.sampler = resume.ShardFrom(shard)
        # Own generators: creating an iterator draws a seed, which must not move torch's global RNG.
        self.train_loader = DataLoader(
            self.data.train,
            batch_size=cfg.micro_batch_size,
            sampler=self.sampler,
            collate_fn=self.collate,
            generator=torch.Generator().manual_seed(cfg.seed),
        )
        self.batches_per_epoch = len(self.train_loader)
        # Eval shards without padding (each example counted once); losses are summed over all ranks.
        self.eval_loader = DataLoader(
            self.data.eval[w.rank :: w.world_size],
            batch_size=cfg.micro_batch_size,
            collate_fn=self.collate,
            generator=torch.Generator(),
        )
        _, self.total = plan_steps(self.batches_per_epoch, cfg)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(params, cfg, w.device)
        self.scheduler = get_scheduler(
            cfg.lr_scheduler,
            self.optimizer,
            num_warmup_steps=warmup_steps(cfg, self.total),
            num_training_steps=self.total,
        )
        self.watchdog = Watchdog.from_config(cfg)
        self.pos = Position()
        if self.resumed is not None:
            self.pos = self.restore(self.resumed.snapshot)
        self.anchor = self.capture()  # what a rollback goes back to: the last checkpoint, else this
        self.window: list[float] = []  # micro-batch-averaged losses of the steps since the last STEP line

    def read_data(self, model_path: Path, base_dir: Path | None) -> extras.AddedTokens:
        """The tokenizer (with the job's added tokens, which it returns), the collator, and the data
        tokenized and split (from the node's cache when a run of the same data kept it: trainer.prepared)."""
        from transformers import AutoTokenizer

        cfg = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        added = extras.add_tokens(self.tokenizer, cfg)  # special_tokens, tokens: before the data is read
        extras.require_trainable(added, cfg)
        pad_id = self.tokenizer.pad_token_id
        self.collate = Collator(self.tokenizer.eos_token_id if pad_id is None else pad_id)
        root = prepared.cache_root(self.job)
        found, _, _ = prepared.examples(cfg, self.tokenizer, base_dir, root, store=self.worker.is_main)
        self.data = split(found, cfg.val_set_size, cfg.seed)
        return added

    def choose_batch_size(self, cfg: TrainConfig, shard_size: int) -> TrainConfig:
        """`cfg` with auto_find_batch_size's micro batch and accumulation (a resumed run keeps its own)."""
        if not cfg.auto_find_batch_size:
            return cfg
        choice = batch_size.Choice.of_checkpoint(self.resumed.state) if self.resumed is not None else None
        if choice is None:
            choice = batch_size.find(
                self.peft_model,
                self.data.train,
                self.collate,
                micro_batch_size=cfg.micro_batch_size,
                gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                shard_size=shard_size,
                device=self.worker.device,
                cap_bytes=self.faults.memory_cap_bytes(self.worker.rank),
                agree=lambda fits: dist.all_true(fits, self.worker),
                autocast=self.precision.autocast,
            )
        self.say(choice.line())
        return cfg.model_copy(update=choice.config_update())

    def say(self, line: lines.Line) -> None:
        if self.worker.is_main:
            lines.emit(line)
            self.tracker.record(line)

    def capture(self) -> Snapshot:
        position = self.pos.normalized(self.batches_per_epoch)
        return snapshot.capture(self.peft_model, self.optimizer, self.scheduler, position, self.worker.device)

    def restore(self, snap: Snapshot) -> Position:
        restored = snapshot.restore(snap, self.peft_model, self.optimizer, self.scheduler, self.worker.device)
        return restored.normalized(self.batches_per_epoch)

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.worker.device) for k, v in batch.items()}
