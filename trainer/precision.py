"""Precision and memory in the builtin recipe: the keys (`PrecisionKeys`, as axolotl means them) and what
they do on the node.

Keys: `bf16: true|false|auto`, `fp16`, `tf32`, `gradient_checkpointing`, `sdp_attention` /
`flash_attention` (the model's `attn_implementation`), `load_in_8bit` / `load_in_4bit` (bitsandbytes; with
`adapter: qlora`, which needs `load_in_4bit`), and the bitsandbytes optimizers (`BNB_OPTIMIZERS`).

Decisions:
- Weights: with bf16 or fp16 the frozen base weights are loaded in that dtype (half the memory, the fast
  matmuls), as axolotl does; LoRA's weights stay float32 (PEFT upcasts adapter weights), so what the
  optimizer updates, and its state, is float32 like the HF Trainer's master weights. Every forward (training,
  eval, eval samples, the batch size trials) runs under `torch.autocast` in that dtype.
- `bf16: auto` (axolotl's default, and ours): bf16 on a CUDA GPU that has it, else fp16 there unless
  `fp16: false` (axolotl's rule). On a CPU, auto stays float32: axolotl's test is for a GPU's bf16, and CPU
  bf16 autocast is slower than float32 on most CPUs; `bf16: true` asks for it (it runs on a CPU).
- fp16 trains with a GradScaler (torch.amp, which runs on a CPU too since torch 2.3). Gradients are
  unscaled before clipping; a step whose scaled gradients overflowed is skipped and the scale lowered, as
  the HF Trainer does. That is not a divergence: the loss watchdog's rollback is for a non-finite loss, or
  an overflow the scale cannot explain any more (scale at or below 1), see `clip_and_step`.
- tf32 is a CUDA matmul setting (Ampere or newer); with no GPU it is an error, never silently nothing.
- A key that needs the node's optional extras (bitsandbytes, flash-attn) or CUDA fails the run at its
  start with a TrainingFailed naming the key (`check_node`): a CPU stand-in for a GPU node never quietly
  trains in float32. The fleet refuses them earlier, at validate, for a node without GPUs (jobs.gpu_keys).

torch, transformers, peft and bitsandbytes are imported inside the functions (the fleet reads this
module's keys without them).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from trainer.errors import TrainingFailed

if TYPE_CHECKING:
    import torch

    from trainer.config import TrainConfig

BnbOptimizer = Literal[
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "paged_lion_8bit"
]
BNB_OPTIMIZERS: tuple[str, ...] = get_args(BnbOptimizer)
ComputeDtype = Literal["bfloat16", "float16"]
MIN_SCALE = 1.0  # an fp16 overflow at or below this loss scale is the gradients' own: a divergence


class PrecisionKeys(BaseModel):
    """The builtin recipe's precision and memory keys (a mixin of trainer.config.TrainConfig)."""

    bf16: bool | Literal["auto"] = Field(
        "auto", description="Mixed precision in bfloat16; auto: on a GPU that has it (float32 on a CPU)."
    )
    fp16: bool | None = Field(None, description="Mixed precision in float16, with a gradient scaler.")
    tf32: bool = Field(False, description="TensorFloat-32 matmuls and convolutions (CUDA, Ampere or newer).")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory, about a third slower."
    )
    sdp_attention: bool = Field(False, description="torch's scaled_dot_product_attention (`sdpa`).")
    flash_attention: bool = Field(
        False, description="FlashAttention 2 (`flash_attention_2`; the flash-attn package and a CUDA GPU)."
    )
    load_in_8bit: bool = Field(False, description="Load the base weights in 8 bits (bitsandbytes, CUDA).")
    load_in_4bit: bool = Field(
        False, description="Load the base weights in 4-bit NF4 with double quantization (bitsandbytes, CUDA)."
    )

    # Field validators (not a model validator), so that a problem names its key and line: each checks a key
    # against one validated before it (this mixin's fields come before TrainConfig's own, `adapter`).
    @field_validator("fp16")
    @classmethod
    def _not_with_bf16(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        if value and info.data.get("bf16") is True:
            raise ValueError("set bf16 or fp16, not both")
        return value

    @field_validator("load_in_4bit")
    @classmethod
    def _not_with_8bit(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("load_in_8bit"):
            raise ValueError("set load_in_8bit or load_in_4bit, not both")
        return value

    @field_validator("flash_attention")
    @classmethod
    def _not_with_sdp(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("sdp_attention"):
            raise ValueError("set flash_attention or sdp_attention, not both")
        return value

    @field_validator("adapter", check_fields=False)
    @classmethod
    def _qlora_is_4bit(cls, value: str, info: ValidationInfo) -> str:
        if value == "qlora" and not info.data.get("load_in_4bit"):
            raise ValueError("qlora needs load_in_4bit: true (as in axolotl); or use adapter: lora")
        return value


def uses_bitsandbytes(config: TrainConfig) -> list[str]:
    """The settings of `config` that need bitsandbytes (and CUDA), as `key` or `key: value`."""
    keys = [key for key in ("load_in_8bit", "load_in_4bit") if getattr(config, key)]
    if config.optimizer in BNB_OPTIMIZERS:
        keys.append(f"optimizer: {config.optimizer}")
    return keys


def check_node(config: TrainConfig, device: torch.device) -> None:
    """TrainingFailed naming the key when this node lacks what a setting needs: CUDA, bitsandbytes or
    flash-attn. Called before the model loads, so a node that cannot train the job says so at once."""
    cuda = device.type == "cuda"
    where = f"this node's device is {device.type}" if not cuda else "this node has a CUDA GPU"
    for key in uses_bitsandbytes(config):
        if not cuda or importlib.util.find_spec("bitsandbytes") is None:
            lacks = "no CUDA GPU" if not cuda else "no bitsandbytes"
            raise TrainingFailed(
                f"{key} needs a CUDA GPU and bitsandbytes on the node; {where} and it has {lacks}. "
                "Install the `gpu` extra (bitsandbytes) on a GPU node, or remove the key"
            )
    if config.flash_attention and (not cuda or importlib.util.find_spec("flash_attn") is None):
        lacks = "no CUDA GPU" if not cuda else "no flash-attn package"
        raise TrainingFailed(
            f"flash_attention needs a CUDA GPU and the flash-attn package on the node; {where} and it has "
            f"{lacks}. Use sdp_attention instead, or install flash-attn in the node's image"
        )
    if config.tf32 and not cuda:
        raise TrainingFailed(f"tf32 is a CUDA matmul setting (Ampere or newer); {where}. Remove tf32")


@dataclass(frozen=True)
class Precision:
    """What one worker computes in, decided once from the config and its device."""

    device_type: str
    dtype: ComputeDtype | None  # None: float32 throughout

    def torch_dtype(self) -> torch.dtype:
        """The dtype the frozen base weights load in (float32 without mixed precision)."""
        import torch

        return getattr(torch, self.dtype) if self.dtype is not None else torch.float32

    def autocast(self) -> AbstractContextManager[Any]:
        """The context every forward pass runs in: torch.autocast in the run's dtype, or nothing."""
        if self.dtype is None:
            return nullcontext()
        return _forward_autocast(self.device_type, self.torch_dtype())

    def grad_scaler(self) -> Any:
        """A torch.amp.GradScaler for fp16 (None otherwise): fp16 gradients underflow without one."""
        if self.dtype != "float16":
            return None
        import torch

        return torch.amp.GradScaler(self.device_type)


@contextmanager
def _forward_autocast(device_type: str, dtype: torch.dtype) -> Iterator[None]:
    """torch.autocast for one forward pass, its cache of cast weights emptied at the end. torch empties
    that cache only when the OUTERMOST autocast context exits: run inside a caller's autocast (a disabled
    one too, which still counts as a level), every forward would reuse the low-precision copies of the
    LoRA weights cast at the first step, and the adapter would never change what the model computes (seen
    on an H200: 180 steps, eval loss unchanged to the last digit)."""
    import torch

    with torch.autocast(device_type, dtype=dtype):
        yield
    torch.clear_autocast_cache()


def decide(config: TrainConfig, device: torch.device) -> Precision:
    """The run's precision on `device` (see the module's notes on `bf16: auto`). TrainingFailed for
    `bf16: true` on a GPU without bfloat16."""
    import torch

    cuda = device.type == "cuda"
    has_bf16 = not cuda or bool(torch.cuda.is_bf16_supported())
    if config.bf16 is True:
        if not has_bf16:
            name = torch.cuda.get_device_name(device)
            raise TrainingFailed(f"bf16: true, but this GPU ({name}) has no bfloat16; use fp16 or bf16: auto")
        return Precision(device.type, "bfloat16")
    if config.fp16:
        return Precision(device.type, "float16")
    if config.bf16 == "auto" and cuda:
        if has_bf16:
            return Precision(device.type, "bfloat16")
        if config.fp16 is None:  # axolotl's auto: fp16 on a GPU without bf16, unless fp16: false
            return Precision(device.type, "float16")
    return Precision(device.type, None)


def apply_tf32(config: TrainConfig) -> None:
    """Let CUDA matmuls and cuDNN convolutions use TensorFloat-32 when `tf32` (check_node: CUDA only)."""
    if not config.tf32:
        return
    import torch

    torch.set_float32_matmul_precision("high")  # tf32 for float32 matmuls (torch.backends.cuda.matmul)
    torch.backends.cudnn.allow_tf32 = True


def attn_implementation(config: TrainConfig) -> str | None:
    """The attention kernel `from_pretrained` gets (None: the model's default)."""
    if config.flash_attention:
        return "flash_attention_2"
    if config.sdp_attention:
        return "sdpa"
    return None


def load_kwargs(config: TrainConfig, precision: Precision, device: torch.device) -> dict[str, Any]:
    """`from_pretrained`'s arguments for the base model: dtype, attention kernel, and bitsandbytes
    quantization (NF4 with double quantization for 4 bits, computing in the run's dtype), which places
    the weights on the worker's device as they load."""
    kwargs: dict[str, Any] = {"dtype": precision.torch_dtype()}
    if (attn := attn_implementation(config)) is not None:
        kwargs["attn_implementation"] = attn
    if config.load_in_4bit or config.load_in_8bit:
        from transformers import BitsAndBytesConfig

        if config.load_in_4bit:
            quant = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=precision.torch_dtype(),
            )
        else:
            quant = BitsAndBytesConfig(load_in_8bit=True)
        kwargs["quantization_config"] = quant
        kwargs["device_map"] = {"": device}
    return kwargs


def prepare_base(model: Any, config: TrainConfig) -> Any:
    """The base model made ready for a LoRA adapter: a quantized one through PEFT's
    `prepare_model_for_kbit_training` (norms in float32, input gradients, checkpointing when asked), or
    gradient checkpointing (non-reentrant) with the input-gradient hook PEFT needs (the frozen embeddings
    give the checkpointed blocks no input that requires a gradient otherwise)."""
    checkpointing = {"use_reentrant": False}
    if config.load_in_4bit or config.load_in_8bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=config.gradient_checkpointing,
            gradient_checkpointing_kwargs=checkpointing,
        )
    elif config.gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x's new name
        if enable is not None:
            enable(activation_checkpointing_kwargs=checkpointing)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
        model.enable_input_require_grads()
    if config.gradient_checkpointing:
        model.config.use_cache = False  # a cache is recomputed away; transformers warns about it otherwise
    return model


def bnb_optimizer(params: list[Any], config: TrainConfig) -> Any:
    """The bitsandbytes optimizer `config.optimizer` names (check_node made sure it is installed)."""
    bnb: Any = importlib.import_module("bitsandbytes")  # an optional extra of the node: no stubs needed
    classes = {
        "adamw_bnb_8bit": bnb.optim.AdamW8bit,
        "adamw_8bit": bnb.optim.AdamW8bit,
        "paged_adamw_8bit": bnb.optim.PagedAdamW8bit,
        "paged_adamw_32bit": bnb.optim.PagedAdamW32bit,
        "paged_lion_8bit": bnb.optim.PagedLion8bit,
    }
    return classes[config.optimizer](params, lr=config.learning_rate, weight_decay=config.weight_decay)


@dataclass(frozen=True)
class StepResult:
    """One optimizer step's outcome: the gradients' norm (after unscaling), and what happened."""

    grad_norm: float
    applied: bool
    skipped: bool  # fp16: the scaler found an overflow and lowered its scale; not a divergence

    @property
    def diverged(self) -> bool:
        """Nothing applied and not the scaler's overflow: the watchdog rolls back."""
        return not self.applied and not self.skipped


def backward(loss: torch.Tensor, scaler: Any) -> None:
    """`loss.backward()`, scaled first under fp16."""
    (scaler.scale(loss) if scaler is not None else loss).backward()


def clip_and_step(
    optimizer: Any,
    params: Iterable[torch.Tensor],
    max_norm: float,
    scaler: Any,
    loss_finite: Callable[[], bool],
) -> StepResult:
    """Unscale (fp16), clip to `max_norm` and step. Without a scaler a non-finite norm applies nothing.
    With one, the scaler skips a step whose gradients overflowed and halves its scale: a skipped step while
    the loss was finite (`loss_finite()`, asked only then) and the scale above MIN_SCALE, a divergence
    otherwise (a NaN loss, or gradients that overflow even unscaled). The caller zeroes the gradients."""
    import torch

    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(list(params), max_norm))
    if scaler is None:
        if math.isfinite(grad_norm):
            optimizer.step()
            return StepResult(grad_norm, applied=True, skipped=False)
        return StepResult(grad_norm, applied=False, skipped=False)
    scale = float(scaler.get_scale())
    scaler.step(optimizer)  # does nothing when unscale_ found an inf or NaN
    scaler.update()
    if math.isfinite(grad_norm):
        return StepResult(grad_norm, applied=True, skipped=False)
    return StepResult(grad_norm, applied=False, skipped=scale > MIN_SCALE and loss_finite())
