"""The training half of a job, for either trainer: the builtin LoRA recipe or axolotl itself.

`FleetKeys` are the keys the fleet reads whatever the trainer (model, datasets, output, hub, W&B, Ray).
`TrainConfig` adds the keys the builtin recipe implements, typed (`trainer: builtin`); `AxolotlConfig`
(`trainer: axolotl`) keeps every other key as written, for axolotl to read on the node. `AnyTrainConfig`
is either, told apart by `trainer`. The front door (jobs.spec, jobs.trainer_choice) decides which; the
node reads the config back from JSON. `trainer` and `axolotl_version` are the fleet's own keys and never
reach axolotl.
"""

from __future__ import annotations

import base64
import posixpath
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    create_model,
    field_validator,
    model_validator,
)

from trainer.extras import ExtrasKeys
from trainer.formats import ChatKeys, DatasetFormatKeys
from trainer.precision import BnbOptimizer, PrecisionKeys
from trainer.progress import NODE_ROOT_ENV

ENV_PREFIX = "b64:"  # a TrainJob in an environment variable (TrainJob.to_env)

# Names under which the trainer builds a model itself instead of downloading it (see trainer.tiny).
BUILTIN_MODELS = ("trainfleet/tiny-llama",)

TrainerName = Literal["builtin", "axolotl"]
FLEET_KEYS = (
    "trainer",
    "axolotl_version",
)  # the fleet's own keys in a job's training part: never sent to axolotl
DatasetType = Literal["alpaca", "completion", "chat_template", "sharegpt", "input_output"]
Scheduler = Literal[
    "cosine", "linear", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial"
]
Optimizer = Literal["adamw_torch", "adamw_torch_fused", "adamw_hf", "sgd", BnbOptimizer]
HUB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$"
# A repository to push to: `org/name`, or `name` alone in the token's own namespace (as transformers allows).
HUB_REPO_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*$"


class DatasetRef(BaseModel):
    """One entry of `datasets:` as the fleet reads it, whatever the trainer: where the data is."""

    model_config = ConfigDict(extra="allow")

    path: str = Field(min_length=1, description="Local file or directory, or a hub dataset id.")
    data_files: str | list[str] | None = Field(None, description="Files inside `path` to read.")
    split: str = Field("train", description="Split name (hub datasets).")


class DatasetConfig(DatasetRef, DatasetFormatKeys):
    """One entry of `datasets:` for the builtin recipe (axolotl's shape). Unknown keys are kept."""

    type: DatasetType = Field(
        "alpaca", description="alpaca, completion, chat_template, sharegpt, input_output (trainer.formats)."
    )
    field: str = Field("text", min_length=1, description="The text field of a `completion` dataset.")


class AxolotlDataset(DatasetRef):
    """One entry of `datasets:` for axolotl: any of axolotl's prompt formats, every key kept for it."""

    type: str | dict[str, Any] | None = Field(None, description="axolotl's prompt strategy.")


class FleetKeys(BaseModel):
    """The keys the fleet itself reads, whatever the trainer; any other key is kept (``extra="allow"``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, allow_inf_nan=False)

    trainer: TrainerName
    base_model: str = Field(min_length=1, description="Hub id or local path of the base model.")
    datasets: Annotated[Sequence[DatasetRef], Field(min_length=1, description="Training datasets.")]
    output_dir: str = Field(
        "./outputs", validate_default=True, description="Where results go, relative to the run's directory."
    )
    hub_model_id: str | None = Field(
        None,
        pattern=HUB_REPO_PATTERN,
        description="Push the result here (`name` alone: the token's namespace).",
    )
    hub_private_repo: bool = Field(True, description="Create the hub repository private (if it is new).")
    hub_strategy: Literal["end", "every_save", "checkpoint", "all_checkpoints"] = Field(
        "end", description="What goes to the hub: the result at the end, or checkpoints too (transformers')."
    )
    wandb_project: str | None = Field(None, description="W&B project.")
    wandb_entity: str | None = Field(None, description="W&B entity.")
    wandb_name: str | None = Field(None, description="W&B run name.")
    wandb_run_id: str | None = Field(None, description="W&B run id.")
    wandb_mode: Literal["online", "offline", "disabled"] | None = Field(None, description="W&B mode.")
    use_ray: bool = Field(False, description="Train with Ray Train's TorchTrainer (else one process).")
    ray_num_workers: int = Field(1, ge=1, le=1024, description="Ray Train workers.")
    resources_per_worker: dict[str, float] | None = Field(
        None, description="Ray resources per worker, e.g. {GPU: 1}; default 1 GPU, or 1 CPU without GPUs."
    )
    ray_run_name: str | None = Field(None, description="Ray Train run name.")

    @field_validator("output_dir")
    @classmethod
    def _output_dir_stays_inside(cls, value: str) -> str:
        norm = posixpath.normpath(value.replace("\\", "/"))
        if posixpath.isabs(norm) or norm == ".." or norm.startswith("../") or "\x00" in norm:
            raise ValueError("must be a relative path inside the run's directory (no '..', not absolute)")
        return norm

    @field_validator("resources_per_worker")
    @classmethod
    def _resources_positive(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            for name, amount in value.items():
                if not name or amount < 0 or amount > 1024:
                    raise ValueError(f"{name!r}: amount must be between 0 and 1024")
        return value

    def extra_keys(self) -> list[str]:
        """Keys trainfleet does not use (kept and passed through), including ones inside datasets."""
        keys = sorted((self.model_extra or {}).keys())
        for i, ds in enumerate(self.datasets):
            keys += [f"datasets[{i}].{k}" for k in sorted((ds.model_extra or {}).keys())]
        return keys


class TrainConfig(FleetKeys, PrecisionKeys, ExtrasKeys, ChatKeys):
    """A job for the builtin recipe: the axolotl keys it implements, typed. Other keys are kept, and the front
    door allows only bookkeeping ones (jobs.trainer_choice)."""

    trainer: Literal["builtin"] = "builtin"
    datasets: Annotated[list[DatasetConfig], Field(min_length=1, description="Training datasets.")]

    adapter: Literal["lora", "qlora"] = Field(
        "lora", description="LoRA; qlora: LoRA on a 4-bit base (load_in_4bit, trainer.precision)."
    )
    lora_r: int = Field(8, ge=1, le=1024, description="LoRA rank.")
    lora_alpha: float = Field(16, gt=0, le=4096, description="LoRA alpha.")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    lora_target_modules: list[str] | None = Field(None, description="Module names to adapt.")
    lora_target_linear: bool | None = Field(None, description="Adapt every linear layer but the LM head.")
    sequence_len: int = Field(512, ge=8, le=131072, description="Tokens per example (truncated).")
    micro_batch_size: int = Field(1, ge=1, le=4096, description="Examples per device per step.")
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=4096, description="Micro batches per optimizer step."
    )
    num_epochs: float = Field(1.0, gt=0, le=1000, description="Passes over the training split.")
    max_steps: int | None = Field(
        None, ge=1, le=10_000_000, description="Stop after this many optimizer steps."
    )
    learning_rate: float = Field(2e-4, gt=0, le=1.0, description="Peak learning rate.")
    lr_scheduler: Scheduler = Field("cosine", description="Learning-rate schedule.")
    warmup_steps: int | None = Field(None, ge=0, le=10_000_000, description="Warm-up steps.")
    warmup_ratio: float | None = Field(None, ge=0.0, le=1.0, description="Warm-up as a share of all steps.")
    optimizer: Optimizer = Field("adamw_torch", description="Optimizer.")
    weight_decay: float = Field(0.0, ge=0.0, le=10.0, description="Weight decay.")
    val_set_size: float = Field(0.0, ge=0.0, description="Eval split: a fraction below 1, or a count.")
    eval_steps: int | None = Field(None, ge=1, description="Evaluate every N steps (and at start and end).")
    eval_table_size: int = Field(
        4, ge=0, le=64, description="Eval examples decoded at each eval (input, prediction, label); 0: none."
    )
    eval_max_new_tokens: int = Field(48, ge=1, le=1024, description="Tokens generated per eval sample.")
    save_steps: int | None = Field(None, ge=1, description="Checkpoint every N steps.")
    logging_steps: int = Field(1, ge=1, description="Report the training loss every N steps.")
    seed: int = Field(42, ge=0, le=2**32 - 1, description="Random seed.")
    train_on_inputs: bool = Field(False, description="Also train on the prompt tokens (alpaca).")
    auto_find_batch_size: bool = Field(
        False,
        description="Before training, raise (or lower) micro_batch_size to the largest that fits, keeping "
        "the effective batch through gradient_accumulation_steps where it can (trainer.batch_size).",
    )
    loss_watchdog_threshold: float | None = Field(
        None,
        gt=0,
        description="Roll back when the logged loss stays above this for loss_watchdog_patience lines.",
    )
    loss_watchdog_patience: int = Field(
        3, ge=1, le=10_000, description="Logged steps in a row above the threshold before a rollback."
    )
    loss_watchdog_max_rollbacks: int = Field(
        3,
        ge=0,
        le=100,
        description="Rollbacks (on a NaN/inf loss, or a loss above the threshold; each halves the learning "
        "rate) before the run fails; 0 fails at once.",
    )
    ray_max_failures: int = Field(
        0,
        ge=0,
        le=100,
        description="Worker failures Ray Train recovers from, resuming from the last checkpoint "
        "(FailureConfig.max_failures); 0 fails the run at the first.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError("set warmup_steps or warmup_ratio, not both")
        if self.val_set_size >= 1 and self.val_set_size != int(self.val_set_size):
            raise ValueError("val_set_size: a fraction below 1, or a whole number of examples")
        return self


# Keys both trainers read with the same meaning: an axolotl job's are checked with the builtin's bounds
# (axolotl has no bounds of its own for them until it starts on the node).
SHARED_TYPED_KEYS = (
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "sequence_len",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "num_epochs",
    "max_steps",
    "learning_rate",
    "warmup_steps",
    "warmup_ratio",
    "weight_decay",
    "val_set_size",
    "seed",
    "train_on_inputs",
    "auto_find_batch_size",
    "loss_watchdog_threshold",
    "loss_watchdog_patience",
)


def _shared_fields() -> dict[str, Any]:
    """The SHARED_TYPED_KEYS as optional fields (absent: axolotl's default), with the builtin's bounds."""
    fields: dict[str, Any] = {}
    for name in SHARED_TYPED_KEYS:
        info = TrainConfig.model_fields[name]
        typed: Any = info.annotation
        if info.metadata:
            typed = Annotated[(typed, *info.metadata)]  # Annotated[T, m1, m2], built from a tuple
        fields[name] = (typed | None, Field(None, description=info.description))
    return fields


if TYPE_CHECKING:
    _AxolotlTyped = FleetKeys
else:
    _AxolotlTyped = create_model("_AxolotlTyped", __base__=FleetKeys, **_shared_fields())


class AxolotlConfig(_AxolotlTyped):
    """A job for axolotl: the fleet's keys and the keys both trainers share typed (an unset one stays
    unset), every other key kept as written for axolotl to check and use on the node."""

    trainer: Literal["axolotl"] = "axolotl"
    datasets: Annotated[list[AxolotlDataset], Field(min_length=1, description="Training datasets.")]
    axolotl_version: str | None = Field(
        None, pattern=r"^[0-9][0-9A-Za-z.+-]*$", description="The axolotl release to train with (node setup)."
    )


def _trainer_of(value: Any) -> str:
    """The trainer a config is for; a config written before the choice existed is the builtin's."""
    found = value.get("trainer") if isinstance(value, dict) else getattr(value, "trainer", None)
    return found if found in ("builtin", "axolotl") else "builtin"


AnyTrainConfig = Annotated[
    Annotated[TrainConfig, Tag("builtin")] | Annotated[AxolotlConfig, Tag("axolotl")],
    Discriminator(_trainer_of),
]


class WandbPlan(BaseModel):
    """The run's W&B run, decided by the fleet at provision: one fleet run is one W&B run, written by the
    trainer's rank 0 only (so it never needs resuming, which offline runs cannot do)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(pattern=r"^[^:;,#?/']+$", description="W&B run id (the fleet derives it).")
    project: str
    entity: str | None = None
    name: str | None = None
    mode: Literal["online", "offline"] = "online"
    group: str | None = Field(None, description="W&B group: the run's sweep, so its runs show together.")
    url: str | None = Field(None, description="The run's page, when it can be known before it starts.")
    lifecycle: list[dict[str, Any]] = Field(
        default_factory=list, description="What happened before training: [{t, event, ...data}]."
    )


class TrainJob(BaseModel):
    """Everything the node needs to train one run; travels as JSON in the Ray job's environment."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(min_length=1, description="The fleet's run id.")
    config: AnyTrainConfig
    work_dir: str = Field(
        description="Scratch directory of this run on the node (Ray storage, checkpoints); a relative path "
        f"is under the node's ${NODE_ROOT_ENV}."
    )
    output_dir: str = Field(
        description=f"Directory on the node that receives the results; relative: under ${NODE_ROOT_ENV}."
    )
    cache_dir: str | None = Field(
        None, description=f"Where base models are kept on the node (relative: under ${NODE_ROOT_ENV})."
    )
    use_gpu: bool = Field(False, description="Whether the node's workers use GPUs.")
    job_yaml: str | None = Field(None, description="The job file with its secrets taken out, for the card.")
    wandb: WandbPlan | None = Field(None, description="The run's W&B run; None: no W&B.")
    prepare_only: bool = Field(
        False, description="Tokenize the datasets into the cache and stop (the section's prepare_ds_only)."
    )
    log_eval: bool | None = Field(
        None, description="The eval samples table: on, off, or None: as the config's eval_table_size says."
    )
    debug: bool = Field(False, description="Verbose logging (the section's `debug`: trainer.verbosity).")
    deepspeed: bool = Field(
        False, description="axolotl with the fleet's DeepSpeed ZeRO-2 config (the section's `deepspeed`)."
    )

    def on_node(self, environ: Mapping[str, str]) -> TrainJob:
        """This job with its directories made absolute on this node. The fleet sends paths relative to the
        node's root to a rented node (it cannot know where that lies); ValueError when one is relative and
        the node has no root."""
        paths = {"work_dir": self.work_dir, "output_dir": self.output_dir, "cache_dir": self.cache_dir}
        relative = {k: v for k, v in paths.items() if v is not None and not posixpath.isabs(v)}
        if not relative:
            return self
        root = environ.get(NODE_ROOT_ENV, "")
        if not posixpath.isabs(root):
            raise ValueError(
                f"{', '.join(relative)} relative but ${NODE_ROOT_ENV} is "
                + (f"not absolute ({root!r})" if root else "not set")
            )
        return self.model_copy(update={k: posixpath.join(root, v) for k, v in relative.items()})

    def to_env(self) -> str:
        """The job as an environment variable's value: JSON in base64, because Ray expands `$NAME` in a
        job's env values on the node, which would put the node's own secrets (`$HF_TOKEN` in a job file's
        text) into what the trainer writes and publishes (the model card)."""
        return ENV_PREFIX + base64.b64encode(self.model_dump_json(exclude_none=True).encode()).decode()

    @classmethod
    def from_env(cls, text: str) -> TrainJob:
        """The job from `to_env`'s text (or plain JSON, as a job file holds it)."""
        if text.startswith(ENV_PREFIX):
            text = base64.b64decode(text[len(ENV_PREFIX) :]).decode()
        return cls.model_validate_json(text)


def as_jsonable(config: FleetKeys) -> dict[str, Any]:
    """The config as plain JSON data, passthrough keys included."""
    return config.model_dump(mode="json", exclude_none=True)
