"""Adapter and checkpoint extras of the builtin recipe, as axolotl means them.

- `lora_modules_to_save`: whole modules (`embed_tokens`, `lm_head`) trained beside the LoRA adapter and
  saved with it (PEFT's `modules_to_save`).
- `special_tokens` / `tokens`: added to the tokenizer before the data is read (`add_tokens`); when the
  tokenizer outgrows the model's embeddings they are resized (`fit_vocabulary`, new rows as the model
  initialises them). A token new to the vocabulary has an untrained embedding row, so, as axolotl refuses,
  it needs the embedding layers in `lora_modules_to_save`; a new `pad_token` is the exception (axolotl's
  too): padding is masked out of attention and loss. `tokens` is refused at validate without
  `lora_modules_to_save`; whether a special token is new is known only with the tokenizer, on the node
  (`require_trainable`, `check_modules_to_save`), before training starts.
- `saves_per_epoch` / `evals_per_epoch`: N times per epoch, every ceil(optimizer steps per epoch / N)
  steps (`interval`): what axolotl's fraction of the run, 1 / (N * num_epochs), works out to. Each is
  exclusive with `save_steps` / `eval_steps`, refused at validate as axolotl does.
- `save_total_limit`: keep the newest N `step-*` checkpoints (trainer.outputs.prune_checkpoints; under
  Ray, `ray_checkpoint_config` keeps as many in Ray's storage).

trainer.config imports this module for `ExtrasKeys`: it imports nothing of the trainer's at load time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from trainer.errors import JobError

if TYPE_CHECKING:
    from ray.train import CheckpointConfig

Token = Annotated[str, Field(min_length=1)]
PAD_KEY = "pad_token"


class SpecialTokens(BaseModel):
    """`special_tokens:` the tokenizer's special tokens to set (axolotl's SpecialTokensConfig)."""

    model_config = ConfigDict(extra="forbid")

    bos_token: Token | None = Field(None, description="Beginning-of-sequence token.")
    eos_token: Token | None = Field(None, description="End-of-sequence token (ends every target).")
    pad_token: Token | None = Field(None, description="Padding token (masked out of attention and loss).")
    unk_token: Token | None = Field(None, description="Unknown token.")
    additional_special_tokens: list[Token] | None = Field(
        None, description="More special tokens (chat markers such as <|im_start|>), never split."
    )

    def named(self) -> dict[str, str]:
        """The named tokens that are set (bos/eos/pad/unk), by key."""
        return {k: v for k, v in self.model_dump(exclude={"additional_special_tokens"}).items() if v}


class ExtrasKeys(BaseModel):
    """The builtin recipe's adapter and checkpoint extras (a base of trainer.config.TrainConfig)."""

    lora_modules_to_save: list[Token] | None = Field(
        None,
        description="Modules trained in full beside the adapter and saved with it (PEFT's modules_to_save), "
        "e.g. [embed_tokens, lm_head]: needed when the vocabulary gains tokens.",
    )
    special_tokens: SpecialTokens | None = Field(None, description="Special tokens to set on the tokenizer.")
    tokens: list[Token] | None = Field(
        None, description="Tokens added to the tokenizer (needs the embeddings in lora_modules_to_save)."
    )
    saves_per_epoch: int | None = Field(
        None, ge=1, le=10_000, description="Checkpoint N times per epoch (exclusive with save_steps)."
    )
    evals_per_epoch: int | None = Field(
        None, ge=1, le=10_000, description="Evaluate N times per epoch (exclusive with eval_steps)."
    )
    save_total_limit: int | None = Field(
        None, ge=1, le=100_000, description="Keep only the newest N checkpoints (older ones are deleted)."
    )

    @field_validator("tokens")
    @classmethod
    def _new_tokens_need_trained_embeddings(cls, value: list[str] | None, info: ValidationInfo) -> Any:
        if value and "lora_modules_to_save" in info.data and not info.data["lora_modules_to_save"]:
            raise ValueError(
                "`lora_modules_to_save` not properly set when adding new tokens (axolotl refuses it too): "
                "a new token's embedding must train; include the model's embedding layers, "
                "[embed_tokens, lm_head] on Llama-style models"
            )
        return value

    # The pairs are checked on whichever of the two pydantic validates second, so the problem names a key
    # the job set (save_steps and eval_steps are TrainConfig's own fields).
    @field_validator("save_steps", "saves_per_epoch", check_fields=False)
    @classmethod
    def _saves_one_way(cls, value: int | None, info: ValidationInfo) -> Any:
        return _exclusive(value, info, ("save_steps", "saves_per_epoch"))

    @field_validator("eval_steps", "evals_per_epoch", check_fields=False)
    @classmethod
    def _evals_one_way(cls, value: int | None, info: ValidationInfo) -> Any:
        return _exclusive(value, info, ("eval_steps", "evals_per_epoch"))


def _exclusive(value: int | None, info: ValidationInfo, pair: tuple[str, str]) -> int | None:
    other = pair[1] if info.field_name == pair[0] else pair[0]
    if value is not None and info.data.get(other) is not None:
        raise ValueError(f"{pair[0]} and {pair[1]} are mutually exclusive: set one of them")
    return value


def interval(every: int | None, per_epoch: int | None, steps_per_epoch: int) -> int | None:
    """The step interval of a periodic save or eval: `every` (save_steps / eval_steps) as given, else
    `per_epoch` times per epoch of `steps_per_epoch` optimizer steps (rounded up, at least 1); None: never."""
    if every is not None:
        return every
    if per_epoch is None:
        return None
    return max(1, math.ceil(steps_per_epoch / per_epoch))


@dataclass(frozen=True)
class AddedTokens:
    """What `add_tokens` found new to the tokenizer's vocabulary, by the key path that asked for each."""

    new: tuple[str, ...] = ()  # e.g. "special_tokens.eos_token", "tokens[0]"

    @property
    def to_learn(self) -> tuple[str, ...]:
        """The new tokens whose embedding must train: all but a pad token."""
        return tuple(key for key in self.new if key != f"special_tokens.{PAD_KEY}")


def add_tokens(tokenizer: Any, config: ExtrasKeys) -> AddedTokens:
    """Set `special_tokens` and add `tokens` to `tokenizer` (in place, in axolotl's order: the named special
    tokens, `tokens`, then the additional special tokens); return which were new to its vocabulary."""
    from tokenizers import AddedToken

    def token(text: str) -> Any:
        return AddedToken(text, rstrip=False, lstrip=False, normalized=False)

    new: list[str] = []
    special = config.special_tokens or SpecialTokens()
    for key, text in special.named().items():
        if text not in tokenizer.get_vocab():
            new.append(f"special_tokens.{key}")
        tokenizer.add_special_tokens({key: token(text)})
    if {"bos_token", "eos_token"} <= special.named().keys() and hasattr(tokenizer, "update_post_processor"):
        tokenizer.update_post_processor()  # a Llama tokenizer adds its bos/eos through its post-processor
    for i, text in enumerate(config.tokens or []):
        if text not in tokenizer.get_vocab():
            new.append(f"tokens[{i}]")
    if config.tokens:
        tokenizer.add_tokens([token(text) for text in config.tokens])
    extra = special.additional_special_tokens or []
    for i, text in enumerate(extra):
        if text not in tokenizer.get_vocab():
            new.append(f"special_tokens.additional_special_tokens[{i}]")
    if extra:
        tokenizer.add_special_tokens({"additional_special_tokens": [token(text) for text in extra]})
    return AddedTokens(tuple(new))


def require_trainable(added: AddedTokens, config: ExtrasKeys) -> None:
    """JobError when a new token must be learnt and no module is trained in full (before the model loads)."""
    if added.to_learn and not config.lora_modules_to_save:
        _refuse(added, "[embed_tokens, lm_head] on Llama-style models")


def fit_vocabulary(model: Any, vocab_size: int | None) -> None:
    """Grow the model's token embeddings (and an untied output head) to `vocab_size` when the tokenizer
    has outgrown them; new rows as the model initialises weights (axolotl's default, no mean resizing)."""
    if vocab_size is not None and vocab_size > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(vocab_size, mean_resizing=False)


def check_modules_to_save(peft_model: Any, added: AddedTokens, config: ExtrasKeys) -> None:
    """JobError unless every `lora_modules_to_save` name matched a module of the model, and the embedding
    layers are among them when a new token must be learnt."""
    from peft.utils import ModulesToSaveWrapper

    wrapped = [name for name, m in peft_model.named_modules() if isinstance(m, ModulesToSaveWrapper)]
    wanted = config.lora_modules_to_save or []
    missing = [w for w in wanted if not any(n == w or n.endswith("." + w) for n in wrapped)]
    if missing:
        raise JobError(
            f"lora_modules_to_save: the model has no module named {', '.join(missing)}; "
            f"its embedding layers are {', '.join(embedding_layers(peft_model))}"
        )
    layers = embedding_layers(peft_model)
    if added.to_learn and not set(layers) <= set(wanted):
        _refuse(added, "[" + ", ".join(layers) + "]")


def embedding_layers(model: Any) -> list[str]:
    """The last names of the model's input embedding and output head modules (`embed_tokens`, `lm_head`)."""
    found = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if id(m) in found and name})


def _refuse(added: AddedTokens, layers: str) -> None:
    raise JobError(
        f"{', '.join(added.to_learn)}: new to the tokenizer, so its embedding must train: "
        f"set lora_modules_to_save to {layers} (axolotl refuses it as well: `Please set "
        "lora_modules_to_save ... when using an adapter and changing the special tokens`)"
    )


def ray_checkpoint_config(config: ExtrasKeys) -> CheckpointConfig:
    """Ray Train's CheckpointConfig for the run: as many checkpoints kept in Ray's storage as
    `save_total_limit` keeps under work_dir (Ray always keeps the latest, which a restart resumes from)."""
    from ray.train import CheckpointConfig

    return CheckpointConfig(num_to_keep=config.save_total_limit)
