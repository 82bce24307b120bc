"""bench/gpu_node.py's own logic, without torch or a GPU: what it reads from the repository, how it reads
the readiness check, how it measures steps/s, and that a run without CUDA is never `ok`."""

from __future__ import annotations

import importlib.util
import json
import re
import stat
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_node.py"


@pytest.fixture(scope="module")
def gpu_node() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_node", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_python(folder: Path, stdout: str, stderr: str = "", code: int = 0) -> str:
    """An executable that answers any command line with `stdout`, `stderr` and exit `code`."""
    (folder / "out.txt").write_text(stdout)
    (folder / "err.txt").write_text(stderr)
    path = folder / "python"
    path.write_text(f"#!/bin/sh\ncat '{folder}/out.txt'\ncat '{folder}/err.txt' >&2\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_reads_the_node_requirements_and_the_fleet_python(gpu_node: ModuleType) -> None:
    reqs = gpu_node.gpu_env.requirements()
    assert reqs["ray"] == "==2.60.*"
    assert {"torch", "transformers", "peft", "pyyaml"} <= set(reqs)
    assert gpu_node.gpu_env.fleet_python() == "3.11"


def test_steps_per_second_leaves_out_intervals_with_an_eval(gpu_node: ModuleType) -> None:
    timed = [
        (0.0, {"kind": "eval", "step": 0}),
        (1.0, {"kind": "step", "step": 5}),
        (2.0, {"kind": "step", "step": 10}),  # 5 steps in 1 s
        (2.5, {"kind": "eval", "step": 10}),
        (9.0, {"kind": "step", "step": 15}),  # after an eval: left out
        (10.0, {"kind": "step", "step": 20}),  # 5 steps in 1 s
    ]
    assert gpu_node.throughput(timed) == 5.0
    assert gpu_node.throughput(timed[:2]) is None


def test_progress_lines_are_found_behind_a_prefix(gpu_node: ModuleType) -> None:
    text = 'noise\n(worker) @@fleet {"kind":"step","step":5}\n@@fleet not json\n'
    assert gpu_node.gpu_env.progress_records(text) == [{"kind": "step", "step": 5}]


def test_the_readiness_check_read_back(gpu_node: ModuleType, tmp_path: Path) -> None:
    line = '@@fleet {"kind":"checked","problems":["asked for 1 GPU, CUDA sees 0"],"cuda":false,"gpus":0}\n'
    readiness = gpu_node.gpu_env.readiness
    found = readiness(fake_python(tmp_path, line), 1, "2.60.0")
    assert found["status"] == "problems" and found["problems"] == ["asked for 1 GPU, CUDA sees 0"]
    clean = line.replace('["asked for 1 GPU, CUDA sees 0"]', "[]")
    assert readiness(fake_python(tmp_path, clean), 1, None)["status"] == "ok"
    old = "python -m trainer: error: argument command: invalid choice: 'check'"
    assert readiness(fake_python(tmp_path, "", old, 2), 1, None)["status"] == "absent"
    assert readiness(fake_python(tmp_path, "", "Traceback ...", 1), 1, None)["status"] == "failed"


def start(cuda: bool | None, check: str = "ok", error: str | None = None) -> dict[str, Any]:
    trained = None if error else True
    return {"cuda": cuda, "check": {"status": check}, "error": error, "trained": trained}


def run(first: float = 7.8, last: float = 3.1) -> dict[str, Any]:
    metrics = {"eval_loss_first": first, "eval_loss": last, "global_step": 180}
    return {"device": "cuda", "bf16": True, "train_s": 9.0, "steps_per_s": 30.0, "metrics": metrics}


def test_ok_only_on_cuda_with_a_clean_check_and_a_falling_loss(gpu_node: ModuleType) -> None:
    result = start(cuda=True)
    assert gpu_node.verdict(result, run()) == 0
    assert result["ok"] is True and result["why_not"] == [] and result["steps_per_s_overall"] == 20.0

    result = start(cuda=True, check="problems")
    assert gpu_node.verdict(result, run()) == 1 and result["ok"] is False

    result = start(cuda=True)
    assert gpu_node.verdict(result, run(last=9.0)) == 1 and result["why_not"] == [
        "the eval loss did not fall"
    ]


def test_a_cpu_run_never_passes(gpu_node: ModuleType) -> None:
    refused = start(cuda=False, check="problems", error="no CUDA: torch sees no GPU; refusing to train")
    assert gpu_node.verdict(refused, None) == 2
    assert refused["ok"] is False and refused["trained"] is None

    allowed = start(cuda=False, check="problems")  # --allow-cpu: finished, exit 0, but not ok
    assert gpu_node.verdict(allowed, run()) == 0
    assert allowed["ok"] is False and "no CUDA" in allowed["why_not"]


# The variants (bench/gpu_variants.py): the plan, the expectations against the recipe's own refusals, and
# how a child's output is judged and summed up. No training: the children here are shell scripts.


def test_the_variant_choice_and_its_defaults(gpu_node: ModuleType) -> None:
    variants = gpu_node.gpu_variants
    assert variants.parse_choice("all") == ["a", "b", "c", "d", "e"]
    assert variants.parse_choice("none") == []
    assert variants.parse_choice("c, a") == ["a", "c"]  # the plan's order
    assert variants.parse_choice("qlora,fp16") == ["a", "c"]
    with pytest.raises(ValueError, match="unknown variant z, bf17"):
        variants.parse_choice("a,z,bf17")
    assert [v.letter for v in variants.plan(None, True)] == ["a", "b", "c", "d", "e"]
    assert variants.plan(None, False) == []  # a CPU runs none unless asked
    assert [v.letter for v in variants.plan(["a"], False)] == ["a"]
    args = gpu_node.parse_args(["--allow-cpu", "--variants", "a", "--max-steps", "4"])
    assert args.variants == ["a"] and args.variant_steps == 8 and args.max_steps == 4
    assert gpu_node.parse_args([]).variants is None
    with pytest.raises(SystemExit):
        gpu_node.parse_args(["--variants", "x"])


def test_each_variant_is_a_valid_job_that_the_recipe_refuses_as_expected(gpu_node: ModuleType) -> None:
    """The keys validate, and the recipe's own check (trainer.precision.check_node) refuses each variant on
    a CPU, and (d) on a GPU without flash-attn, with the words the plan expects (no torch needed)."""
    import yaml

    from trainer.config import TrainConfig
    from trainer.errors import TrainingFailed
    from trainer.precision import check_node
    from trainer.tiny import TINY_SPEC

    variants = gpu_node.gpu_variants
    raw = gpu_node.gpu_child.tiny_job(yaml)
    cpu, gpu = SimpleNamespace(type="cpu"), SimpleNamespace(type="cuda")
    no_libraries = {"bitsandbytes": None, "flash_attn": None}
    for variant in variants.VARIANTS.values():
        config = TrainConfig.model_validate(variants.variant_config(raw, variant, 8))
        assert config.max_steps == 8 and config.eval_table_size == 0 and not config.use_ray
        assert config.save_steps == (4 if variant.resume else None)
        if "bitsandbytes" in variant.needs:  # big enough for the 8-bit state (4096+) and paging (1e5+)
            assert config.lora_r * TINY_SPEC.hidden_size >= 4096
            assert config.lora_modules_to_save == ["lm_head"]
            assert TINY_SPEC.vocab_size * TINY_SPEC.hidden_size >= variants.PAGED_MIN
        expected = variants.expectation(variant, False, no_libraries).error
        with pytest.raises(TrainingFailed, match=re.escape(expected)):
            check_node(config, cpu)
        on_gpu = variants.expectation(variant, True, no_libraries)
        if on_gpu.error is not None:  # (d): refused, not skipped
            with pytest.raises(TrainingFailed, match=re.escape(on_gpu.error)):
                check_node(config, gpu)
        else:
            assert (on_gpu.skip is not None) == bool(variant.needs)
    qlora = TrainConfig.model_validate(variants.variant_config(raw, variants.VARIANTS["a"], 8))
    assert qlora.adapter == "qlora" and qlora.optimizer == "paged_adamw_8bit" and qlora.gradient_checkpointing


def child_output(steps: list[tuple[int, float]], **result: Any) -> str:
    lines = ["@@fleet " + json.dumps({"kind": "step", "step": s, "loss": loss}) for s, loss in steps]
    return "\n".join([*lines, "@@gpu-variant " + json.dumps(result), ""])


EIGHT = [(s, 3.0 - s / 10) for s in range(1, 9)]


def test_a_variant_child_judged(gpu_node: ModuleType) -> None:
    variants = gpu_node.gpu_variants
    fp16, train, cpu = variants.VARIANTS["c"], variants.Expect(), variants.Expect(error="tf32 is a CUDA")
    done = child_output(EIGHT, metrics={"global_step": 8}, peak_gpu_mem_mib=312.5)
    ok = variants.judge(fp16, train, 8, 0, done, "")
    assert (ok.status, ok.steps, ok.loss_first, ok.loss_last, ok.peak_gpu_mem_mib) == (
        "ok",
        8,
        2.9,
        2.2,
        312.5,
    )

    short = variants.judge(fp16, train, 8, 0, child_output(EIGHT[:5], metrics={"global_step": 5}), "")
    assert short.status == "failed" and short.error == "trained 5 steps, not 8"
    nan = variants.judge(fp16, train, 8, 0, child_output([(1, float("nan"))], metrics={"global_step": 8}), "")
    assert nan.status == "failed" and "no finite loss on every step: [nan]" in str(nan.error)
    raised = child_output([], error="OutOfMemoryError: CUDA out of memory")
    assert variants.judge(fp16, train, 8, 1, raised, "").error == "OutOfMemoryError: CUDA out of memory"
    crashed = variants.judge(fp16, train, 8, -11, "", "Traceback ...\nRuntimeError: CUDA error: illegal\n")
    assert crashed.status == "failed" and crashed.error == "RuntimeError: CUDA error: illegal"

    refused = child_output([], error="TrainingFailed: tf32 is a CUDA matmul setting (Ampere or newer)")
    assert variants.judge(fp16, cpu, 8, 1, refused, "").status == "expected_failure_ok"
    trained = variants.judge(fp16, cpu, 8, 0, done, "")
    assert trained.status == "unexpected" and trained.error == "got a finished run"
    other = variants.judge(fp16, cpu, 8, 1, raised, "")
    assert other.status == "unexpected" and "OutOfMemoryError" in str(other.error)
    assert variants.problems([ok, trained]) == ["variant c (fp16) unexpected: got a finished run"]


def test_the_resume_variant_needs_its_resume_and_the_same_optimizer_state(gpu_node: ModuleType) -> None:
    variants = gpu_node.gpu_variants
    resume, train = variants.VARIANTS["e"], variants.Expect()
    state = {"crashed_at": 4, "uint8_state_tensors": 6, "differences": []}
    resumed = '@@fleet {"kind": "resumed", "step": 4}\n'
    e_losses = [*EIGHT[:4], (5, 2.5), (6, 2.46), (7, 2.3), (8, 2.2)]  # (a): 2.5, 2.4, 2.3, 2.2
    good = resumed + child_output(e_losses, metrics={"global_step": 8}, resume=state)
    assert variants.judge(resume, train, 8, 0, good, "").status == "ok"

    bad = {**state, "differences": ["/state/3/state1: tensor differs"], "uint8_state_tensors": 0}
    wrong = variants.judge(
        resume, train, 8, 0, child_output(EIGHT, metrics={"global_step": 8}, resume=bad), ""
    )
    assert wrong.status == "failed"
    assert "expected one resume from step 4, got []" in str(wrong.error)
    assert "no 8-bit optimizer state" in str(wrong.error) and "state1: tensor differs" in str(wrong.error)

    a = variants.judge(
        variants.VARIANTS["a"], train, 8, 0, child_output(EIGHT, metrics={"global_step": 8}), ""
    )
    e = variants.judge(resume, train, 8, 0, good, "")
    variants.compare_resume([a, e])
    assert e.resume["loss_vs_a_max_rel_diff"] == pytest.approx(0.06 / 2.4, abs=1e-6)  # step 6


def test_the_plan_runs_skips_and_tallies(gpu_node: ModuleType, tmp_path: Path) -> None:
    """run_plan with a stand-in interpreter: no bitsandbytes (a, b, e skipped), no flash-attn ((d) must be
    refused, and is), and (c) trains."""
    variants = gpu_node.gpu_variants
    (tmp_path / "c.txt").write_text(child_output(EIGHT, metrics={"global_step": 8}))
    refusal = (
        "TrainingFailed: flash_attention needs ...; this node has a CUDA GPU and it has no flash-attn package"
    )
    (tmp_path / "d.txt").write_text(child_output([], error=refusal))
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -c ]; then echo \'{"bitsandbytes": null, "flash_attn": null}\'; exit 0; fi\n'
        'shift 4; cat "' + str(tmp_path) + '/$1.txt"\n'  # python SCRIPT --child WORK --variant X
        '[ "$1" = c ]\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    said: list[str] = []
    libraries, outcomes = variants.run_plan(
        variants.plan(None, True),
        cuda=True,
        python=str(python),
        script=tmp_path / "gpu_node.py",
        work=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        steps=8,
        timeout=30,
        say=said.append,
    )
    assert libraries == {"bitsandbytes": None, "flash_attn": None}
    assert variants.tally(outcomes) == {"skipped": ["a", "b", "e"], "ok": ["c"], "expected_failure_ok": ["d"]}
    assert outcomes[0].why == "no bitsandbytes in the node's interpreter"
    assert variants.problems(outcomes) == [] and len(said) == 6


def test_a_failed_variant_fails_the_check(gpu_node: ModuleType) -> None:
    result = start(cuda=True)
    result["variant_problems"] = ["variant b (8bit) failed: RuntimeError: CUDA error"]
    assert gpu_node.verdict(result, run()) == 1
    assert result["ok"] is False and result["why_not"] == result["variant_problems"]

    cpu = start(cuda=False, check="problems")  # --allow-cpu --variants a: refused as expected
    cpu["variant_problems"] = []
    assert gpu_node.verdict(cpu, run()) == 0 and cpu["ok"] is False
    cpu = start(cuda=False, check="problems")
    cpu["variant_problems"] = ["variant a (qlora) unexpected: got a finished run"]
    assert gpu_node.verdict(cpu, run()) == 1
