"""The builtin recipe's GPU-only paths, for bench/gpu_node.py: short "variants" of the tiny job after its
main run, each trained in its own child process and reported on its own.

    (a) qlora   adapter qlora, load_in_4bit, paged_adamw_8bit, gradient_checkpointing, bf16
    (b) 8bit    load_in_8bit, adamw_bnb_8bit, bf16
    (c) fp16    fp16 (a GradScaler), sdp_attention, tf32
    (d) flash   flash_attention, bf16
    (e) resume  (a) with a checkpoint halfway, a crash after it (FLEET_INJECT), and a resume from it

Every variant trains `--variant-steps` steps (8), a loss line each step, eval at start and end only, no
eval table. The bitsandbytes ones also train `lm_head` in full (`lora_modules_to_save`) at `lora_r: 32`:
bitsandbytes keeps a 32-bit state for a parameter under 4096 elements and pages only buffers of 1e5 or
more, so at the tiny job's r 8 neither the 8-bit state nor paging would ever be used.

(e) answers whether a paged 8-bit optimizer's state survives trainer.snapshot's capture and restore: after
the crash the child builds the run again (trainer.recipe_setup.RunSetup, which resumes) and compares the
optimizer state it restored with the checkpoint's optimizer.pt, tensor by tensor, then trains on to the end.
Where (a) ran too, the losses after the resume are compared with (a)'s at the same steps (information: GPU
kernels need not be bit-for-bit deterministic).

Outcome (`status`): `ok`; `failed` (with the error's last line); `skipped` (the interpreter lacks the
library the path needs, bitsandbytes: `why` says so, and it does not count against the check);
`expected_failure_ok` (the path must be refused with the recipe's clear error, and was: every variant on
a CPU, "needs a CUDA GPU" or tf32's; (d) on a GPU without flash-attn); `unexpected` (that refusal did not
come: counts as failed). Standard library only at import; the child's side (training a variant, (e)'s
restore and comparison) is bench/gpu_variants_child.py, where torch and the trainer load.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu_env import progress_records

REPO = Path(__file__).resolve().parents[1]
RESULT = "@@gpu-variant "  # a variant child's result line
DEFAULT_STEPS = 8
TIMEOUT_S = 300.0  # one variant on a GPU takes seconds; a hang must not eat the session
PAGED_MIN = 100_000  # bitsandbytes pages optimizer buffers of this many elements or more
NO_CUDA = "needs a CUDA GPU"  # check_node's refusal of a bitsandbytes key or flash_attention without CUDA
BNB_SIZE: dict[str, Any] = {"lora_r": 32, "lora_modules_to_save": ["lm_head"]}
QLORA: dict[str, Any] = {
    "adapter": "qlora",
    "load_in_4bit": True,
    "optimizer": "paged_adamw_8bit",
    "gradient_checkpointing": True,
    "bf16": True,
    **BNB_SIZE,
}


@dataclass(frozen=True)
class Variant:
    """One GPU-only path: the keys it sets on the tiny job, and how the recipe must refuse it where it
    cannot run (on a CPU; on a GPU without the module in `needs`, else it is skipped)."""

    letter: str
    name: str
    keys: dict[str, Any]
    cpu_error: str  # in the recipe's TrainingFailed on a CPU
    needs: tuple[str, ...] = ()  # modules the path imports on a GPU
    missing_error: str | None = None  # in the TrainingFailed when one is missing (None: skipped instead)
    resume: bool = False


VARIANTS: dict[str, Variant] = {
    v.letter: v
    for v in (
        Variant("a", "qlora", QLORA, NO_CUDA, ("bitsandbytes",)),
        Variant(
            "b",
            "8bit",
            {"load_in_8bit": True, "optimizer": "adamw_bnb_8bit", "bf16": True, **BNB_SIZE},
            NO_CUDA,
            ("bitsandbytes",),
        ),
        Variant(
            "c",
            "fp16",
            {"fp16": True, "bf16": False, "sdp_attention": True, "tf32": True},
            "tf32 is a CUDA matmul setting",
        ),
        Variant(
            "d",
            "flash",
            {"flash_attention": True, "bf16": True},
            "flash_attention " + NO_CUDA,
            ("flash_attn",),
            missing_error="it has no flash-attn package",
        ),
        Variant("e", "resume", QLORA, NO_CUDA, ("bitsandbytes",), resume=True),
    )
}

LIBRARY_PROBE = """import importlib.metadata as m, importlib.util as u, json
found = {}
for module, dist in (("bitsandbytes", "bitsandbytes"), ("flash_attn", "flash-attn")):
    try:
        found[module] = m.version(dist) if u.find_spec(module) else None
    except m.PackageNotFoundError:
        found[module] = "unknown version"
print(json.dumps(found))"""


def parse_choice(text: str) -> list[str]:
    """`--variants`: all, none, or letters and names separated by commas (`a,c` or `qlora,fp16`), in the
    plan's order. ValueError naming what is unknown."""
    text = text.strip().lower()
    if text == "all":
        return list(VARIANTS)
    if text in ("none", ""):
        return []
    names = {v.name: v.letter for v in VARIANTS.values()}
    asked = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in asked if part not in VARIANTS and part not in names]
    if unknown:
        known = ", ".join(f"{v.letter} ({v.name})" for v in VARIANTS.values())
        raise ValueError(f"unknown variant {', '.join(unknown)}: all, none, or some of {known}")
    letters = {names.get(part, part) for part in asked}
    return [letter for letter in VARIANTS if letter in letters]


def plan(chosen: list[str] | None, cuda: bool) -> list[Variant]:
    """The variants to run: those chosen, else all on CUDA and none on a CPU."""
    letters = chosen if chosen is not None else (list(VARIANTS) if cuda else [])
    return [VARIANTS[letter] for letter in letters]


@dataclass(frozen=True)
class Expect:
    """What a variant should do here: train, be skipped (`skip`: why), or fail with `error` in its message."""

    skip: str | None = None
    error: str | None = None


def expectation(variant: Variant, cuda: bool, libraries: dict[str, str | None]) -> Expect:
    """A CPU refuses every variant with its clear error; a GPU without a module a variant needs refuses it
    (`missing_error`) or the variant is skipped."""
    if not cuda:
        return Expect(error=variant.cpu_error)
    missing = [module for module in variant.needs if not libraries.get(module)]
    if not missing:
        return Expect()
    if variant.missing_error is not None:
        return Expect(error=variant.missing_error)
    return Expect(skip=f"no {', '.join(missing)} in the node's interpreter")


@dataclass
class Outcome:
    """One variant's result, as the JSON line shows it."""

    variant: str
    name: str
    status: str  # ok | failed | skipped | expected_failure_ok | unexpected
    error: str | None = None  # the error's last line (the expected one, for expected_failure_ok)
    why: str | None = None  # skipped: why; expected_failure_ok / unexpected: what was expected
    steps: int | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    seconds: float | None = None
    peak_gpu_mem_mib: float | None = None
    step_losses: dict[str, float] = field(default_factory=dict)  # step -> loss, every STEP line
    resume: dict[str, Any] | None = None  # (e): what the crash, the restore and the resume showed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def child_result(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT):
            data = json.loads(line[len(RESULT) :])
            return data if isinstance(data, dict) else None
    return None


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def judge(variant: Variant, expect: Expect, steps: int, code: int, stdout: str, stderr: str) -> Outcome:
    """A variant's Outcome from its child's exit status and output (seconds are the caller's)."""
    result = child_result(stdout) or {}
    losses = {
        str(r["step"]): r["loss"] for r in progress_records(stdout) if r.get("kind") == "step" and "loss" in r
    }
    values = list(losses.values())
    metrics = result.get("metrics") or {}
    error = result.get("error") or (None if code == 0 and result else last_line(stderr) or f"exit {code}")
    out = Outcome(
        variant.letter,
        variant.name,
        "ok",
        error=error,
        steps=metrics.get("global_step", max(map(int, losses), default=None)),
        loss_first=values[0] if values else None,
        loss_last=values[-1] if values else None,
        peak_gpu_mem_mib=result.get("peak_gpu_mem_mib"),
        step_losses=losses,
        resume=result.get("resume"),
    )
    if expect.error is not None:
        out.why = f"expected the recipe's refusal: ...{expect.error}..."
        refused = error is not None and error.startswith("TrainingFailed") and expect.error in error
        out.status = "expected_failure_ok" if refused else "unexpected"
        if not refused:
            out.error = f"got {error or 'a finished run'}"
        return out
    problems = [] if error is None else [error]
    if not problems and out.steps != steps:
        problems.append(f"trained {out.steps} steps, not {steps}")
    if not problems and not (values and all(isinstance(v, float) and math.isfinite(v) for v in values)):
        problems.append(f"no finite loss on every step: {values}")
    if not problems and variant.resume:
        problems += resume_problems(out.resume or {}, progress_records(stdout), steps)
    if problems:
        out.status, out.error = "failed", "; ".join(problems)
    return out


def resume_problems(resume: dict[str, Any], progress: list[dict[str, Any]], steps: int) -> list[str]:
    """What (e) got wrong: no resume from the halfway checkpoint, no 8-bit state in it, or a restored
    optimizer state unlike the saved one."""
    half = max(1, steps // 2)
    found = []
    resumed = [r.get("step") for r in progress if r.get("kind") == "resumed"]
    if resumed != [half]:
        found.append(f"expected one resume from step {half}, got {resumed}")
    if not resume.get("uint8_state_tensors"):
        found.append("no 8-bit optimizer state in the checkpoint")
    if resume.get("differences"):
        found.append(f"the restored optimizer state differs from the saved one: {resume['differences']}")
    return found


def compare_resume(outcomes: list[Outcome]) -> None:
    """(e)'s losses after its resume against (a)'s at the same steps, when both trained: `loss_vs_a`."""
    by = {o.variant: o for o in outcomes}
    a, e = by.get("a"), by.get("e")
    if a is None or e is None or a.status != "ok" or e.resume is None:
        return
    after = int(e.resume.get("crashed_at", 0))
    pairs = [
        (e.step_losses[s], a.step_losses[s]) for s in e.step_losses if int(s) > after and s in a.step_losses
    ]
    if pairs:
        diff = max(abs(x - y) / max(abs(y), 1e-9) for x, y in pairs)
        e.resume["loss_vs_a_max_rel_diff"] = round(diff, 6)


def problems(outcomes: list[Outcome]) -> list[str]:
    """The why_not lines of the variants that failed (or were not refused as they should have been)."""
    return [
        f"variant {o.variant} ({o.name}) {o.status}: {o.error}"
        for o in outcomes
        if o.status in ("failed", "unexpected")
    ]


def tally(outcomes: list[Outcome]) -> dict[str, list[str]]:
    """Variant letters by status, for a glance at the JSON line."""
    found: dict[str, list[str]] = {}
    for o in outcomes:
        found.setdefault(o.status, []).append(o.variant)
    return found


def probe_libraries(python: str, env: dict[str, str]) -> dict[str, str | None]:
    """bitsandbytes' and flash-attn's versions in `python` (None: not installed)."""
    done = subprocess.run(
        [python, "-c", LIBRARY_PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"probing bitsandbytes and flash-attn failed: {last_line(done.stderr)}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {str(k): v for k, v in found.items()}


def run_one(
    variant: Variant, expect: Expect, argv: list[str], env: dict[str, str], steps: int, timeout: float
) -> Outcome:
    """Run one variant's child (`argv`) and judge it."""
    if expect.skip is not None:
        return Outcome(variant.letter, variant.name, "skipped", why=expect.skip)
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        code, stdout, stderr = -9, text, f"timed out after {timeout:g} s"
    out = judge(variant, expect, steps, code, stdout, stderr)
    out.seconds = round(time.monotonic() - started, 1)
    return out


def run_plan(
    variants: list[Variant],
    *,
    cuda: bool,
    python: str,
    script: Path,
    work: Path,
    env: dict[str, str],
    steps: int,
    timeout: float,
    say: Callable[[str], None],
) -> tuple[dict[str, str | None], list[Outcome]]:
    """Run `variants` one after another (each `script --child WORK --variant X`); the libraries found and
    the outcomes, (e)'s compared with (a)'s."""
    if not variants:
        return {}, []
    libraries = probe_libraries(python, env)
    say(f"variants: {', '.join(f'{v.letter} ({v.name})' for v in variants)}; libraries: {libraries}")
    outcomes = []
    for variant in variants:
        argv = [
            python,
            str(script),
            "--child",
            str(work),
            "--variant",
            variant.letter,
            f"--max-steps={steps}",
        ]
        out = run_one(variant, expectation(variant, cuda, libraries), argv, env, steps, timeout)
        shown = (
            out.why if out.status == "skipped" else out.error or f"loss {out.loss_first} -> {out.loss_last}"
        )
        say(f"  variant {variant.letter} ({variant.name}): {out.status} ({out.seconds} s) {shown}")
        outcomes.append(out)
    compare_resume(outcomes)
    return libraries, outcomes


def variant_config(raw: dict[str, Any], variant: Variant, steps: int) -> dict[str, Any]:
    """The tiny job's config (provider sections already out) for `variant`: one process, `steps` steps,
    a loss line each, eval at start and end only, no eval table; (e) checkpoints halfway."""
    config = {**raw, **variant.keys}
    config.update(use_ray=False, max_steps=steps, logging_steps=1, eval_table_size=0)
    config.pop("eval_steps", None)
    config.pop("save_steps", None)
    if variant.resume:
        config["save_steps"] = max(1, steps // 2)
    return config
