"""bench/trainer.py's children: what runs in each child process (`bench/trainer.py --child KIND`), prepare
(the plan for this device, the model, every step's tokens) or train with one trainer, then print the RESULT
line. torch, transformers, PEFT, TRL and the trainer load inside the functions; bench/trainer.py has put the
repository first on sys.path and imports this file as bench.trainer_children."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import trainer_figures as figures

REPO = Path(__file__).resolve().parents[1]
RESULT = "@@bench-trainer "  # a child's result line
MARKER = "@@fleet "  # trainer.progress.MARKER
MIB = 2**20


Plan, DATA, shape_of = figures.Plan, figures.DATA, figures.shape_of


def train_config(plan: Plan, model_path: Path) -> Any:
    """The recipe's TrainConfig for `plan` (the one source of every hyperparameter, for all three trainers),
    with its precision keys: bf16 as planned (not the recipe's `auto`), tf32 and sdp_attention on a GPU."""
    from trainer.config import TrainConfig

    raw: dict[str, Any] = {
        "base_model": str(model_path),
        "datasets": [{"path": str(DATA), "type": "alpaca"}],
        "adapter": "lora",
        "lora_r": plan.lora_r,
        "lora_alpha": plan.lora_alpha,
        "lora_dropout": 0.0,
        "lora_target_linear": True,
        "sequence_len": plan.seq_len,
        "micro_batch_size": plan.micro,
        "gradient_accumulation_steps": plan.gas,
        "max_steps": plan.steps,
        "learning_rate": plan.lr,
        "lr_scheduler": plan.scheduler,
        "warmup_steps": plan.warmup,
        "optimizer": plan.optimizer,
        "val_set_size": plan.eval_count,
        "logging_steps": 1,
        "eval_table_size": 0,
        "seed": plan.seed,
        "use_ray": False,
        "bf16": plan.bf16,
    }
    if plan.cuda:
        raw.update(tf32=True, sdp_attention=True)
    return TrainConfig.model_validate(raw)


def schedule(n_train: int, plan: Plan) -> list[list[list[int]]]:
    """The recipe's training order: per optimizer step, its micro batches of example indices (the recipe's
    seeded DistributedSampler, epoch after epoch). Epochs must split into whole steps, so that a sequential
    sampler over the concatenation gives the other trainers the very same batches."""
    from torch.utils.data import DistributedSampler

    if n_train % plan.micro or (n_train // plan.micro) % plan.gas:
        raise ValueError(
            f"{n_train} training examples do not split into whole steps of {plan.micro} x {plan.gas}: pick a "
            "micro batch and accumulation that divide it"
        )
    sampler = DistributedSampler(range(n_train), num_replicas=1, rank=0, shuffle=True, seed=plan.seed)
    steps: list[list[list[int]]] = []
    epoch = 0
    while len(steps) < plan.steps:
        sampler.set_epoch(epoch)
        indices = list(sampler)
        batches = [indices[i : i + plan.micro] for i in range(0, n_train, plan.micro)]
        steps += [batches[i : i + plan.gas] for i in range(0, len(batches), plan.gas)]
        epoch += 1
    return steps[: plan.steps]


def step_stats(lengths: list[int], steps: list[list[list[int]]]) -> list[list[int]]:
    """Per step: [real tokens, padded tokens (each micro batch padded to its longest), Σn²]."""
    found = []
    for step in steps:
        tokens = padded = squares = 0
        for batch in step:
            sizes = [lengths[i] for i in batch]
            tokens += sum(sizes)
            padded += len(sizes) * max(sizes)
            squares += sum(n * n for n in sizes)
        found.append([tokens, padded, squares])
    return found


def prepare_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Decide the plan for this device, build the model, count every step's tokens; what is missing."""
    import importlib.metadata as metadata

    import torch
    from transformers import AutoTokenizer

    from trainer.data import prepare
    from trainer.tiny import SIZES, build_tiny

    cuda = torch.cuda.is_available() and not payload["cpu"]
    plan = Plan.default(cuda, payload["overrides"])
    if plan.bf16 and not torch.cuda.is_bf16_supported():
        raise SystemExit("bench.trainer: this GPU has no bf16")
    model = build_tiny(Path(payload["cache"]), SIZES[plan.size])
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    split = prepare(train_config(plan, model), tokenizer, REPO)
    steps = step_stats([len(e.input_ids) for e in split.train], schedule(len(split.train), plan))
    missing = {}
    for name in ("trl", "datasets"):
        if importlib.util.find_spec(name) is None:
            missing["trl_sft"] = f"{name} is not installed here (pip install -e '.[bench]')"
    versions = {}
    for name in ("torch", "transformers", "peft", "accelerate", "trl", "datasets"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "plan": asdict(plan),
        "model_path": str(model),
        "shape": asdict(shape_of(config, plan.lora_r)),
        "steps": steps,
        "train_examples": len(split.train),
        "eval_examples": len(split.eval),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "missing": missing,
        "versions": versions,
    }


class Clock:
    """When each optimizer step ended (seconds from this clock's start), after a CUDA sync on a GPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.start, self.times = cuda, time.perf_counter(), []  # type: list[float]

    def tick(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.start)


class StepLines:
    """sys.stdout for the recipe: passes everything through and ticks the clock at each STEP line."""

    def __init__(self, out: Any, clock: Clock) -> None:
        self.out, self.clock, self.pending = out, clock, ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            at = line.find(MARKER)
            if at >= 0 and json.loads(line[at + len(MARKER) :]).get("kind") == "step":
                self.clock.tick()
        return self.out.write(text)  # type: ignore[no-any-return]

    def flush(self) -> None:
        self.out.flush()


def run_builtin(plan: Plan, model: Path, work: Path, clock: Clock) -> dict[str, Any]:
    """trainer.recipe.run in this process, timed at its STEP lines (logging_steps 1)."""

    from trainer import recipe
    from trainer.config import TrainJob

    cfg = train_config(plan, model)
    job = TrainJob(
        run_id="bench-builtin",
        config=cfg,
        work_dir=str(work / "run"),
        output_dir=str(work / "out"),
        cache_dir=str(work / "cache"),
        use_gpu=plan.cuda,
    )
    keys = ("bf16", "tf32", "sdp_attention")
    notes = ["the recipe got " + ", ".join(f"{k}: {str(getattr(cfg, k)).lower()}" for k in keys)]
    # No autocast around the recipe, not even a disabled one: torch would keep its cache of cast weights
    # across the recipe's forwards (trainer.precision._forward_autocast says why the recipe now copes).
    real, sys.stdout = sys.stdout, StepLines(sys.stdout, clock)  # type: ignore[assignment]
    try:
        metrics = recipe.run(job, model, base_dir=REPO)
    finally:
        sys.stdout = real
    return {
        "eval_loss": metrics["eval_loss"],
        "eval_loss_first": metrics["eval_loss_first"],
        "trainable_params": metrics["trainable_params"],
        "notes": notes,
    }


def eval_loss(model: Any, examples: list[Any], plan: Plan, pad_id: int) -> float:
    """Token-weighted mean loss over `examples`, as trainer.recipe evaluates (the same batches, the same
    per-batch sums: trainer.recipe.summed_loss)."""
    import torch

    from trainer.data import Collator
    from trainer.recipe import summed_loss

    device = torch.device("cuda" if plan.cuda else "cpu")
    collate, total, count = Collator(pad_id), 0.0, 0.0
    model.eval()
    with torch.no_grad():
        for at in range(0, len(examples), plan.micro):
            batch = {k: v.to(device) for k, v in collate(examples[at : at + plan.micro]).items()}
            batch_sum, batch_tokens = summed_loss(
                model, batch, lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=plan.bf16)
            )
            total, count = total + batch_sum, count + batch_tokens
    model.train()
    return total / max(count, 1.0)


def hf_arguments(plan: Plan, work: Path, fields: set[str]) -> dict[str, Any]:
    """TrainingArguments (and SFTConfig's shared part) matching the recipe's settings of `plan`."""
    args: dict[str, Any] = {
        "output_dir": str(work / "hf"),
        "max_steps": plan.steps,
        "per_device_train_batch_size": plan.micro,
        "gradient_accumulation_steps": plan.gas,
        "learning_rate": plan.lr,
        "lr_scheduler_type": plan.scheduler,
        "warmup_steps": plan.warmup,
        "optim": plan.optimizer,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,  # the recipe's MAX_GRAD_NORM
        "logging_steps": plan.steps,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": plan.seed,
        "dataloader_num_workers": 0,
        "bf16": plan.bf16,
        "gradient_checkpointing": False,
        "remove_unused_columns": False,
        "label_names": ["labels"],
        "use_cpu": not plan.cuda,
    }
    if plan.cuda:
        args["tf32"] = True
    if "train_sampling_strategy" in fields:
        args["train_sampling_strategy"] = "sequential"
    return args


def run_hf(plan: Plan, model: Path, work: Path, clock: Clock, trl: bool) -> dict[str, Any]:
    """transformers' Trainer (or TRL's SFTTrainer) on a PEFT model with the recipe's data, order, LoRA
    and hyperparameters, timed by a callback at each step's end."""
    import dataclasses

    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

    from trainer.data import Collator, prepare
    from trainer.lora import lora_targets

    cfg = train_config(plan, model)
    torch.manual_seed(plan.seed)  # as the recipe does, before the adapter is made
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    pad_id = tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    split = prepare(cfg, tokenizer, REPO)
    dtype = torch.bfloat16 if plan.bf16 else torch.float32
    base = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype, attn_implementation="sdpa")
    alpha = int(plan.lora_alpha) if float(plan.lora_alpha).is_integer() else plan.lora_alpha
    lora = LoraConfig(
        r=plan.lora_r,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=lora_targets(base, cfg),
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(base, lora).to("cuda" if plan.cuda else "cpu")
    first = eval_loss(peft_model, split.eval, plan, pad_id)
    ordered = [split.train[i] for step in schedule(len(split.train), plan) for batch in step for i in batch]
    notes = ["base model loaded in bf16 (LoRA weights fp32), bf16 mixed precision"] if plan.bf16 else []

    class Tick(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            clock.tick()

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    settings = hf_arguments(plan, work, fields)
    trainer_cls: Any = Trainer
    if trl:
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        rows = [{"input_ids": e.input_ids, "labels": e.labels} for e in ordered]
        config: Any = SFTConfig(**settings, max_length=plan.seq_len, packing=False)
        kwargs = {"train_dataset": Dataset.from_list(rows), "processing_class": tokenizer}
        trainer_cls = SFTTrainer
    else:
        config = TrainingArguments(**settings)
        kwargs = {"train_dataset": ordered, "data_collator": Collator(pad_id)}
    if "train_sampling_strategy" not in fields:  # an older transformers: keep the order all the same

        class Ordered(trainer_cls):  # type: ignore[misc, valid-type]
            def _get_train_sampler(self, *args: Any, **kw: Any) -> Any:
                return SequentialSampler(self.train_dataset)

        trainer_cls = Ordered
        notes.append("sequential order through _get_train_sampler (no train_sampling_strategy here)")
    trainer = trainer_cls(model=peft_model, args=config, callbacks=[Tick()], **kwargs)
    trainer.train()
    return {
        "eval_loss": eval_loss(peft_model, split.eval, plan, pad_id),
        "eval_loss_first": first,
        "trainable_params": sum(p.numel() for p in peft_model.parameters() if p.requires_grad),
        "notes": notes,
    }


def peak_mem_mib(cuda: bool) -> float:
    """CUDA's max_memory_allocated on a GPU, else this process's peak RSS (Linux reports KiB)."""
    if cuda:
        import torch

        return torch.cuda.max_memory_allocated() / MIB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, payload: dict[str, Any]) -> None:
    """In a child process: prepare, or train with one trainer; print the RESULT line."""
    if kind == "prepare":
        result = prepare_child(payload)
    else:
        plan, model, work = Plan(**payload["plan"]), Path(payload["model_path"]), Path(payload["work"])
        clock = Clock(plan.cuda)
        if kind == "builtin":
            result = run_builtin(plan, model, work, clock)
        else:
            result = run_hf(plan, model, work, clock, trl=kind == "trl_sft")
        result.update(step_times=clock.times, peak_mem_mib=peak_mem_mib(plan.cuda))
    print(RESULT + json.dumps(result), flush=True)
