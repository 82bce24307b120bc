"""The model side of the recipe: the base model wrapped in a fresh LoRA adapter, and its optimizer.

How the base loads (dtype, attention kernel, 4/8 bits) and is prepared (gradient checkpointing, k-bit
training) is trainer.precision's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer import extras, precision
from trainer.config import TrainConfig

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


def build_optimizer(params: list[Any], config: TrainConfig, device: Any) -> Any:
    """torch AdamW for the adamw_* names (fused on GPU for adamw_torch_fused), SGD for sgd, bitsandbytes'
    for the 8-bit and paged ones (trainer.precision.BNB_OPTIMIZERS)."""
    import torch

    if config.optimizer in precision.BNB_OPTIMIZERS:
        return precision.bnb_optimizer(params, config)
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    fused = config.optimizer == "adamw_torch_fused" and device.type == "cuda"
    return torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused)


def load_lora_model(
    model_path: Path,
    config: TrainConfig,
    run_precision: precision.Precision,
    device: Any,
    vocab_size: int | None = None,
) -> tuple[Any, list[str]]:
    """The base model from `model_path` (in the run's dtype, quantized when asked, see trainer.precision)
    wrapped in a fresh LoRA adapter (its weights float32), and its target names. Its embeddings grow to
    `vocab_size` first when the tokenizer has outgrown them (trainer.extras: before the input-gradient hook
    of prepare_base, which a resize would drop)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    loading = precision.load_kwargs(config, run_precision, device)
    base = AutoModelForCausalLM.from_pretrained(str(model_path), **loading)
    extras.fit_vocabulary(base, vocab_size)
    base = precision.prepare_base(base, config)
    targets = lora_targets(base, config)
    alpha = config.lora_alpha
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=int(alpha) if float(alpha).is_integer() else alpha,
        lora_dropout=config.lora_dropout,
        target_modules=targets,
        modules_to_save=config.lora_modules_to_save or None,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, lora), targets
