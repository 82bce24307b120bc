"""trainer.precision and jobs.gpu_keys: mixed precision, gradient checkpointing and the attention kernel on
the tiny model (CPU), the clear errors for what needs a GPU node, and the validate-time refusals."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from core.errors import ConfigError, Problem
from jobs.spec import LoadedJob, parse_job
from tests.factories import train_config, train_job
from trainer import faults, lora, precision, progress, recipe
from trainer.errors import TrainingFailed
from trainer.tiny import build_tiny
from trainer.watchdog import Reason

REPO = Path(__file__).resolve().parents[2]
TINY = "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n"
LORA = TINY + "adapter: lora\n"
QLORA = TINY + "adapter: qlora\n"
ONE_GPU = "local:\n  num_gpus: 1\n"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("cache"))


def quick(**overrides: Any) -> Any:
    """A short run: 3 steps of short sequences, evaluated at the start and the end only, no checkpoint, no
    eval samples (they generate; not what is tested here)."""
    values: dict[str, Any] = {
        "learning_rate": 0.01,
        "max_steps": 3,
        "sequence_len": 64,
        "eval_steps": None,
        "save_steps": None,
        "eval_table_size": 0,
    }
    return train_config(**{**values, **overrides})


@pytest.fixture
def linear_dtypes() -> Iterator[set[torch.dtype]]:
    """The dtypes of every nn.Linear output while the test runs (a global forward hook)."""
    seen: set[torch.dtype] = set()

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        if isinstance(module, torch.nn.Linear) and isinstance(output, torch.Tensor):
            seen.add(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def test_bf16_on_cpu_loads_the_base_in_bf16_keeps_lora_in_fp32_and_trains(
    tmp_path: Path, model_path: Path, linear_dtypes: set[torch.dtype]
) -> None:
    config = quick(bf16=True)
    run_precision = precision.decide(config, CPU)
    assert run_precision == precision.Precision("cpu", "bfloat16") and run_precision.grad_scaler() is None
    model, _ = lora.load_lora_model(model_path, config, run_precision, CPU)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}  # what the optimizer updates
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}  # the frozen base

    linear_dtypes.clear()
    metrics = recipe.run(train_job(tmp_path, config), model_path)
    assert linear_dtypes == {torch.bfloat16}  # every projection (and LoRA's) ran under bf16 autocast
    assert metrics["eval_loss"] is not None and metrics["eval_loss_first"] is not None
    assert metrics["eval_loss"] < metrics["eval_loss_first"] - 0.1


def test_bf16_learns_inside_a_callers_autocast_even_a_disabled_one(tmp_path: Path, model_path: Path) -> None:
    # torch empties autocast's cache of cast weights only when the outermost context exits: a harness's
    # disabled autocast around the recipe once froze the LoRA weights each forward saw at their first cast
    # (found on an H200 by bench/gpu_node.py: eval loss unchanged over 180 steps).
    config = quick(bf16=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        metrics = recipe.run(train_job(tmp_path, config), model_path)
    assert metrics["eval_loss"] is not None and metrics["eval_loss_first"] is not None
    assert metrics["eval_loss"] < metrics["eval_loss_first"] - 0.1


def test_bf16_auto_is_bf16_on_a_gpu_and_float32_on_a_cpu() -> None:
    assert precision.decide(quick(), CPU).dtype is None  # the default, auto: float32 on a CPU
    assert precision.decide(quick(bf16=False), CPU).dtype is None
    assert precision.decide(quick(fp16=True), CPU).dtype == "float16"  # fp16 wins over auto (axolotl's)


def test_fp16_on_cpu_trains_with_a_grad_scaler_and_a_nan_loss_still_rolls_back(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = quick(fp16=True, max_steps=2, sequence_len=48, val_set_size=4)
    assert isinstance(precision.decide(config, CPU).grad_scaler(), torch.amp.GradScaler)
    monkeypatch.setenv(faults.ENV_VAR, "nan_at_step:2")  # a NaN loss is a divergence, not a skipped step
    metrics = recipe.run(train_job(tmp_path, config), model_path)
    (rollback,) = [r for r in progress.parse(capsys.readouterr().out) if r["kind"] == "rollback"]
    assert (rollback["step"], rollback["to_step"], rollback["reason"]) == (2, 0, Reason.NON_FINITE.value)
    assert metrics["global_step"] == 2 and math.isfinite(metrics["train_loss"])
    assert metrics["eval_loss"] is not None and metrics["eval_loss_first"] is not None
    assert metrics["eval_loss"] < metrics["eval_loss_first"]


def test_gradient_checkpointing_trains_to_the_same_loss(tmp_path: Path, model_path: Path) -> None:
    config = quick(gradient_checkpointing=True)
    model, _ = lora.load_lora_model(model_path, config, precision.decide(config, CPU), CPU)
    assert model.base_model.model.is_activation_checkpointing and model.config.use_cache is False
    with_it = recipe.run(train_job(tmp_path / "gc", config), model_path)
    without = recipe.run(train_job(tmp_path / "plain", quick()), model_path)
    assert with_it["eval_loss"] == pytest.approx(without["eval_loss"], rel=1e-4)
    assert with_it["train_loss"] == pytest.approx(without["train_loss"], rel=1e-4)


def test_sdp_attention_sets_the_models_attention_kernel(model_path: Path) -> None:
    config = quick(sdp_attention=True)
    run_precision = precision.decide(config, CPU)
    assert precision.load_kwargs(config, run_precision, CPU)["attn_implementation"] == "sdpa"
    assert "attn_implementation" not in precision.load_kwargs(quick(), run_precision, CPU)
    model, _ = lora.load_lora_model(model_path, config, run_precision, CPU)
    assert model.config._attn_implementation == "sdpa"
    eager = quick(sdp_attention=False)
    assert precision.attn_implementation(eager) is None
    assert precision.attn_implementation(quick(flash_attention=True)) == "flash_attention_2"


def test_flash_attention_without_flash_attn_or_cuda_fails_the_run_naming_the_key(
    tmp_path: Path, model_path: Path
) -> None:
    with pytest.raises(TrainingFailed, match=r"^flash_attention needs a CUDA GPU and the flash-attn package"):
        recipe.run(train_job(tmp_path, quick(flash_attention=True)), model_path)


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"load_in_4bit": True, "adapter": "qlora"}, "load_in_4bit"),
        ({"load_in_8bit": True}, "load_in_8bit"),
        ({"optimizer": "paged_adamw_8bit"}, "optimizer: paged_adamw_8bit"),
    ],
)
def test_bitsandbytes_keys_on_a_cpu_node_fail_clearly_never_train_in_fp32(
    keys: dict[str, Any], named: str
) -> None:
    with pytest.raises(TrainingFailed) as info:
        precision.check_node(quick(**keys), CPU)
    assert str(info.value).startswith(f"{named} needs a CUDA GPU and bitsandbytes on the node;")
    assert "device is cpu" in str(info.value)


def test_load_in_4bit_on_the_cpu_stops_the_run_before_the_model_loads(
    tmp_path: Path, model_path: Path
) -> None:
    with pytest.raises(TrainingFailed, match="load_in_4bit needs a CUDA GPU and bitsandbytes"):
        recipe.run(train_job(tmp_path, quick(load_in_4bit=True, adapter="qlora")), model_path)
    with pytest.raises(TrainingFailed, match="tf32 is a CUDA matmul setting"):
        precision.check_node(quick(tf32=True), CPU)


def test_the_4bit_load_is_nf4_with_double_quant_computing_in_the_runs_dtype() -> None:
    config = quick(load_in_4bit=True, adapter="qlora", bf16=True)
    kwargs = precision.load_kwargs(config, precision.Precision("cuda", "bfloat16"), torch.device("cuda", 0))
    quant = kwargs["quantization_config"]
    assert (quant.load_in_4bit, quant.bnb_4bit_quant_type) == (
        True,
        "nf4",
    ) and quant.bnb_4bit_use_double_quant
    assert quant.bnb_4bit_compute_dtype == torch.bfloat16 and kwargs["dtype"] == torch.bfloat16
    assert kwargs["device_map"] == {"": torch.device("cuda", 0)}


# --- the fp16 step: an overflow the scaler catches is a skipped step, not a rollback ---------------------


def scaled_grads(scaler: torch.amp.GradScaler, grad: float) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    """A one-weight model whose scaled gradient is `grad` (inf: an fp16 overflow)."""
    layer = torch.nn.Linear(1, 1, bias=False)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    precision.backward(layer(torch.ones(1, 1)).sum(), scaler)
    layer.weight.grad = torch.full_like(layer.weight, grad * scaler.get_scale())
    return layer, optimizer


def test_an_fp16_overflow_skips_the_step_and_lowers_the_scale() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    layer, optimizer = scaled_grads(scaler, math.inf)
    before = layer.weight.detach().clone()
    step = precision.clip_and_step(optimizer, layer.parameters(), 1.0, scaler, lambda: True)
    assert (step.applied, step.skipped, step.diverged) == (False, True, False)
    assert torch.equal(layer.weight, before) and scaler.get_scale() == 512.0

    layer, optimizer = scaled_grads(scaler, 4.0)  # unscaled before clipping: a norm of 4, clipped to 1
    before = layer.weight.detach().clone()
    step = precision.clip_and_step(optimizer, layer.parameters(), 1.0, scaler, lambda: True)
    assert step.applied and step.grad_norm == pytest.approx(4.0)
    assert float(layer.weight.detach() - before) == pytest.approx(-0.1, abs=1e-6)  # lr x the clipped grad


def test_a_nan_loss_or_an_overflow_at_scale_one_is_a_divergence_under_fp16_too() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    layer, optimizer = scaled_grads(scaler, math.nan)
    assert precision.clip_and_step(optimizer, layer.parameters(), 1.0, scaler, lambda: False).diverged
    low = torch.amp.GradScaler("cpu", init_scale=1.0)
    layer, optimizer = scaled_grads(low, math.inf)
    assert precision.clip_and_step(optimizer, layer.parameters(), 1.0, low, lambda: True).diverged
    layer, optimizer = scaled_grads(torch.amp.GradScaler("cpu", enabled=False), math.inf)
    assert precision.clip_and_step(optimizer, layer.parameters(), 1.0, None, lambda: True).diverged


# --- validate: consistency, and what a node without GPUs cannot run ----------------------------------------


def parse(text: str) -> LoadedJob:
    return parse_job(text.encode(), source="job.yml", base_dir=REPO)


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value.problems


@pytest.mark.parametrize(
    ("keys", "path", "says"),
    [
        ("bf16: true\nfp16: true\n", "fp16", "set bf16 or fp16, not both"),
        ("load_in_8bit: true\nload_in_4bit: true\n", "load_in_4bit", "set load_in_8bit or load_in_4bit"),
        ("sdp_attention: true\nflash_attention: true\n", "flash_attention", "set flash_attention or sdp"),
    ],
)
def test_inconsistent_keys_are_refused_with_key_and_line(keys: str, path: str, says: str) -> None:
    (problem,) = problems_of(LORA + keys + ONE_GPU)
    assert (problem.path, problem.line) == (path, 7) and says in problem.message


def test_qlora_needs_load_in_4bit() -> None:
    (problem,) = problems_of(QLORA)
    assert (problem.path, problem.line) == ("adapter", 5)
    assert "qlora needs load_in_4bit: true" in problem.message
    job = parse(QLORA + "load_in_4bit: true\n" + ONE_GPU)
    assert job.choice is not None and job.choice.trainer == "builtin" and job.spec.train.load_in_4bit


def test_a_node_without_gpus_refuses_the_gpu_only_keys_with_the_reason() -> None:
    text = LORA + "load_in_4bit: true\noptimizer: adamw_bnb_8bit\ntf32: true\nflash_attention: true\n"
    problems = problems_of(text)
    assert [(p.path, p.line) for p in problems] == [
        ("load_in_4bit", 6),
        ("optimizer", 7),
        ("tf32", 8),
        ("flash_attention", 9),
    ]
    assert problems[0].message.startswith(
        "load_in_4bit needs a CUDA GPU (bitsandbytes' 4-bit weights); this job's node (local, num_gpus: 0) "
        "has none"
    )
    assert "adamw_bnb_8bit is a bitsandbytes optimizer" in problems[1].message
    on_a_gpu = parse(text + ONE_GPU)
    assert on_a_gpu.choice is not None and on_a_gpu.choice.trainer == "builtin"


def test_what_a_cpu_runs_is_allowed_on_a_node_without_gpus_for_both_trainers() -> None:
    cpu_keys = "bf16: true\ngradient_checkpointing: true\nsdp_attention: true\n"
    builtin = parse(LORA + cpu_keys)
    assert builtin.choice is not None and builtin.choice.trainer == "builtin"
    assert builtin.spec.train.bf16 is True
    assert parse(LORA + "fp16: true\n").spec.gpu_count == 0
    axolotl = LORA + cpu_keys + "sample_packing: true\n"
    assert parse(axolotl).choice is not None
    (problem,) = problems_of(axolotl + "load_in_8bit: true\n")  # axolotl's load_in_8bit means the same
    assert problem.path == "load_in_8bit" and "num_gpus: 0" in problem.message
