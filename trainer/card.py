"""The model card (README.md) written next to a trained adapter.

The YAML header mirrors what PEFT 0.21 writes for a LoRA adapter (`library_name: peft`,
`pipeline_tag: text-generation`, `base_model`, the `base_model:adapter:<id>` tag), set explicitly so that
no local path leaks in: `base_model` is the hub id from the job, and it is left out when the job named a
local directory. Dataset entries are given as in the job; an absolute path is reduced to its file name.
The text is written here directly (`ModelCard.from_template` would need Jinja2); it parses with
`huggingface_hub.ModelCard`. An axolotl job's card shows the axolotl settings it can read (adapter, LoRA
shape, batch, schedule) and the axolotl release that trained it; without an adapter (axolotl's full
fine-tune) it describes a whole model (`library_name: transformers`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, NotRequired, TypedDict

import yaml

from trainer.config import BUILTIN_MODELS, HUB_ID_PATTERN, AxolotlConfig, FleetKeys, TrainConfig

TAGS = ("lora", "transformers", "trainfleet")


def hub_id(base_model: str) -> str | None:
    """`base_model` if it names a hub repository (built-in names included), None if it is a local path."""
    if base_model in BUILTIN_MODELS:
        return base_model
    if re.fullmatch(HUB_ID_PATTERN, base_model) and not Path(base_model).expanduser().exists():
        return base_model
    return None


def dataset_names(config: FleetKeys) -> list[str]:
    """The datasets as the job gives them: hub ids as they are, local paths (absolute, or relative to
    what travelled to a rented node) reduced to their last component."""
    names = []
    for ds in config.datasets:
        path = ds.path.replace("\\", "/")
        local = path.startswith(("/", "~")) or not re.fullmatch(HUB_ID_PATTERN, path)
        names.append(PurePosixPath(path).name if local else path)
    return names


class CardMetadata(TypedDict):
    """The card's YAML header, in this order."""

    base_model: NotRequired[str]  # left out for a local base model
    datasets: list[str]
    library_name: str
    pipeline_tag: str
    tags: list[str]


def adapter_of(config: TrainConfig | AxolotlConfig) -> str | None:
    """The adapter the job trains (lora, qlora, ...), None for axolotl's full fine-tune."""
    if isinstance(config, TrainConfig):
        return config.adapter
    adapter = written(config).get("adapter")
    return str(adapter) if adapter else None


def written(config: AxolotlConfig) -> dict[str, Any]:
    """An axolotl job's keys as written: the typed ones that are set, and the rest (`model_extra`)."""
    return config.model_dump(mode="json", exclude_none=True)


def metadata(config: TrainConfig | AxolotlConfig) -> CardMetadata:
    """The card's YAML header as a dict."""
    base = hub_id(config.base_model)
    adapter = adapter_of(config)
    relation = "adapter" if adapter else "finetune"
    tags = list(TAGS) if adapter else [t for t in TAGS if t != "lora"]
    data = CardMetadata(
        datasets=dataset_names(config),
        library_name="peft" if adapter else "transformers",
        pipeline_tag="text-generation",
        tags=([f"base_model:{relation}:{base}"] if base is not None else [])
        + tags
        + (["axolotl"] if isinstance(config, AxolotlConfig) else []),
    )
    if base is not None:
        data = {"base_model": base, **data}  # first, as PEFT writes it
    return data


def render(
    config: TrainConfig | AxolotlConfig,
    metrics: Mapping[str, Any],
    *,
    run_id: str,
    target_modules: Sequence[str],
    job_yaml: str | None = None,
    wandb_url: str | None = None,
    trainer_version: str | None = None,
) -> str:
    """The whole README.md: YAML header, a short description, hyperparameters, final metrics, usage, and
    the job file (its secrets already taken out by the fleet) when given. `trainer_version`: the axolotl
    release that trained an axolotl job (default: the job's `axolotl_version`)."""
    base = hub_id(config.base_model)
    title = config.hub_model_id or f"trainfleet run {run_id}"
    header = yaml.safe_dump(metadata(config), sort_keys=False, allow_unicode=True)
    workers = int(metrics.get("num_workers", config.ray_num_workers if config.use_ray else 1))
    if isinstance(config, TrainConfig):
        hyper, how = builtin_rows(config, target_modules, workers, metrics.get("precision")), ""
    else:
        version = trainer_version or config.axolotl_version or ""
        hyper = axolotl_rows(config, target_modules, workers, version)
        how = f" (axolotl {version})" if version else " (axolotl)"
    results: list[tuple[str, Any]] = [
        ("eval loss before training", _num(metrics.get("eval_loss_first"))),
        ("eval loss after training", _num(metrics.get("eval_loss"))),
        ("train loss (mean)", _num(metrics.get("train_loss"))),
        ("optimizer steps", metrics.get("global_step", "-")),
        (
            "train / eval examples",
            f"{metrics.get('train_examples', '-')} / {metrics.get('eval_examples', '-')}",
        ),
        ("training time (s)", _num(metrics.get("train_runtime_s"), 1)),
    ]
    adapter = adapter_of(config)
    kind = f"A {'QLoRA' if adapter == 'qlora' else 'LoRA'} adapter for" if adapter else "A fine-tune of"
    about = f"{kind} `{base}`" if base else f"{kind} a local base model"
    load_base = base or "<path to the base model>"
    if base in BUILTIN_MODELS:
        about += " (not on the hub: trainfleet builds it locally, see `trainer.tiny.resolve_model`)"
    tracked = f" The W&B run: [{wandb_url}]({wandb_url})." if wandb_url else ""
    job = f"\n## Job\n\n```yaml\n{job_yaml.rstrip()}\n```\n" if job_yaml else ""
    return (
        f"---\n{header}---\n\n# {title}\n\n"
        f"{about}, trained with trainfleet{how} on {', '.join(f'`{d}`' for d in dataset_names(config))}."
        f"{tracked}\n\n"
        f"## Training hyperparameters\n\n{_table(hyper)}\n## Results\n\n{_table(results)}\n"
        f"## Usage\n\n{_usage(load_base, adapter is not None, _grew(config))}"
        f"{job}"
    )


def builtin_rows(
    config: TrainConfig, target_modules: Sequence[str], workers: int, computed: str | None = None
) -> list[tuple[str, Any]]:
    """The builtin recipe's hyperparameters, every one typed and known."""
    warmup = config.warmup_steps if config.warmup_steps is not None else f"ratio {config.warmup_ratio or 0}"
    return [
        ("adapter", f"LoRA r={config.lora_r}, alpha={config.lora_alpha:g}, dropout={config.lora_dropout:g}"),
        ("target modules", ", ".join(target_modules)),
        ("sequence length", config.sequence_len),
        ("micro batch size", config.micro_batch_size),
        ("gradient accumulation steps", config.gradient_accumulation_steps),
        ("workers", workers),
        ("effective batch size", config.micro_batch_size * config.gradient_accumulation_steps * workers),
        ("epochs", f"{config.num_epochs:g}"),
        ("max steps", config.max_steps if config.max_steps is not None else "-"),
        ("learning rate", f"{config.learning_rate:g}"),
        ("scheduler", config.lr_scheduler),
        ("warmup", warmup),
        ("optimizer", config.optimizer),
        ("weight decay", f"{config.weight_decay:g}"),
        ("precision", _precision(config, computed)),
        ("gradient checkpointing", config.gradient_checkpointing),
        ("train on inputs", config.train_on_inputs),
        ("seed", config.seed),
    ]


def _precision(config: TrainConfig, computed: str | None) -> str:
    """What the run computed in (`computed`, from its metrics; else what the job asked), with the base
    weights' quantization when there is one."""
    asked = (
        "float16"
        if config.fp16
        else "bfloat16"
        if config.bf16 is True
        else "bf16: auto"
        if config.bf16
        else "float32"
    )
    bits = (
        ", base weights 4-bit NF4"
        if config.load_in_4bit
        else ", base weights 8-bit"
        if config.load_in_8bit
        else ""
    )
    return (computed or asked) + bits


def axolotl_rows(
    config: AxolotlConfig, target_modules: Sequence[str], workers: int, version: str
) -> list[tuple[str, Any]]:
    """The axolotl settings the card can read from the job (as written; "-" where the job left axolotl's
    default)."""
    extra = written(config)

    def get(key: str) -> Any:
        value = extra.get(key)
        return "-" if value is None else value

    adapter = extra.get("adapter")
    shape = f"{adapter} r={get('lora_r')}, alpha={get('lora_alpha')}, dropout={get('lora_dropout')}"
    targets = ", ".join(target_modules) or ("all linear layers" if extra.get("lora_target_linear") else "-")
    micro, accumulation = extra.get("micro_batch_size"), extra.get("gradient_accumulation_steps") or 1
    effective = (
        micro * accumulation * workers if isinstance(micro, int) and isinstance(accumulation, int) else "-"
    )
    return [
        ("trainer", f"axolotl {version}".rstrip()),
        ("adapter", shape if adapter else "none (full fine-tune)"),
        ("target modules", targets if adapter else "-"),
        ("sequence length", get("sequence_len")),
        ("micro batch size", get("micro_batch_size")),
        ("gradient accumulation steps", get("gradient_accumulation_steps")),
        ("workers", workers),
        ("effective batch size", effective),
        ("epochs", get("num_epochs")),
        ("max steps", get("max_steps")),
        ("learning rate", get("learning_rate")),
        ("scheduler", get("lr_scheduler")),
        (
            "warmup",
            get("warmup_steps") if extra.get("warmup_ratio") is None else f"ratio {extra['warmup_ratio']}",
        ),
        ("optimizer", get("optimizer")),
        ("weight decay", get("weight_decay")),
        ("seed", get("seed")),
    ]


def _grew(config: TrainConfig | AxolotlConfig) -> bool:
    """Whether the job may have added tokens (the base's embeddings must grow before the adapter loads)."""
    extra = config.model_extra or {}
    return bool(getattr(config, "tokens", None) or getattr(config, "special_tokens", None)) or bool(
        extra.get("tokens") or extra.get("special_tokens")
    )


def _usage(load_base: str, adapter: bool, grew: bool = False) -> str:
    if not adapter:
        return (
            "```python\nfrom transformers import AutoModelForCausalLM\n\n"
            'model = AutoModelForCausalLM.from_pretrained("<this directory or repository>")\n```\n'
        )
    resize = (
        'tokenizer = AutoTokenizer.from_pretrained("<this directory or repository>")\n'
        "base.resize_token_embeddings(len(tokenizer))  # the job added tokens\n"
        if grew
        else ""
    )
    imports = "AutoModelForCausalLM, AutoTokenizer" if grew else "AutoModelForCausalLM"
    return (
        f"```python\nfrom peft import PeftModel\nfrom transformers import {imports}\n\n"
        f'base = AutoModelForCausalLM.from_pretrained("{load_base}")\n{resize}'
        'model = PeftModel.from_pretrained(base, "<this directory or repository>")\n```\n'
    )


def write(path: Path, text: str) -> None:
    """Write the card text to `path` (normally <output_dir>/README.md)."""
    path.write_text(text, encoding="utf-8")


def _num(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"


def _table(rows: Sequence[tuple[str, Any]]) -> str:
    lines = ["| | |", "|---|---|"]
    lines += [f"| {name} | {str(value).replace('|', '&#124;')} |" for name, value in rows]
    return "\n".join(lines) + "\n"
