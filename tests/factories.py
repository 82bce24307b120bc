"""Object builders shared by the tests. Add new builders here rather than in the tests themselves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import yaml
from celery import Celery

from core.errors import FailureReason
from jobs.sections import LocalSection, SectionBase, section_models
from jobs.spec import JobSpec
from state.ledger import Draft, Ledger
from state.models import Instance, Run
from state.payloads import (
    InstanceRequested,
    RunFailed,
    RunQueued,
    RunSucceeded,
    StageStarted,
    TrainEval,
    TrainStep,
    WandbRun,
)
from state.stages import RunState, Stage
from trainer import faults, progress
from trainer.config import AxolotlConfig, TrainConfig, TrainJob, WandbPlan

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_YAML = REPO_ROOT / "configs" / "examples" / "tiny-lora.yml"
TINY_DATA = REPO_ROOT / "configs" / "examples" / "data" / "tiny-alpaca.jsonl"


def example_config(**overrides: Any) -> TrainConfig:
    """The example job's TrainConfig (configs/examples/tiny-lora.yml), dataset paths made absolute (they
    are relative to the YAML file), with `overrides` applied on top."""
    raw = yaml.safe_load(EXAMPLE_YAML.read_text(encoding="utf-8"))
    for ds in raw["datasets"]:
        ds["path"] = str((EXAMPLE_YAML.parent / ds["path"]).resolve())
    raw.update(overrides)
    return TrainConfig.model_validate(raw)


def train_config(**overrides: Any) -> TrainConfig:
    """A small config on the bundled dataset for fast single-process runs (no Ray)."""
    values: dict[str, Any] = {
        "base_model": "trainfleet/tiny-llama",
        "datasets": [{"path": str(TINY_DATA), "type": "alpaca"}],
        "lora_r": 4,
        "lora_alpha": 8,
        "sequence_len": 96,
        "micro_batch_size": 4,
        "max_steps": 4,
        "learning_rate": 0.002,
        "warmup_steps": 1,
        "val_set_size": 8,
        "eval_steps": 2,
        "save_steps": 3,
        "logging_steps": 2,
    }
    values.update(overrides)
    return TrainConfig.model_validate(values)


def axolotl_config(**overrides: Any) -> AxolotlConfig:
    """A small axolotl job on the tiny model and the bundled dataset (axolotl's `alpaca` over JSON Lines):
    a few steps that evaluate and checkpoint, fast on a CPU."""
    values: dict[str, Any] = {
        "trainer": "axolotl",
        "base_model": "trainfleet/tiny-llama",
        "datasets": [{"path": str(TINY_DATA), "type": "alpaca", "ds_type": "json"}],
        "adapter": "lora",
        "lora_r": 4,
        "lora_alpha": 8,
        "lora_target_linear": True,
        "sequence_len": 96,
        "micro_batch_size": 4,
        "num_epochs": 1,
        "max_steps": 6,
        "learning_rate": 0.002,
        "lr_scheduler": "cosine",
        "optimizer": "adamw_torch",
        "val_set_size": 0.1,
        "eval_steps": 3,
        "save_steps": 3,
        "logging_steps": 1,
    }
    values.update(overrides)
    return AxolotlConfig.model_validate(values)


def job_spec(section: SectionBase | None = None) -> JobSpec:
    """The small `train_config()` job on `section`'s provider (default: a plain `local:` section)."""
    section = section if section is not None else LocalSection()
    provider = next(name for name, model in section_models().items() if isinstance(section, model))
    return JobSpec(train=train_config(), provider=provider, section=section)


def ledger_run(run_id: str, section: SectionBase, state: RunState = RunState.QUEUED, **fields: Any) -> Run:
    """A Run as the ledger holds it: the small `train_config()` job on `section`'s provider, in `state`,
    with `fields` set (instance, progress, ray_jobs, ...). For tests that put runs in the ledger by hand."""
    spec = job_spec(section)
    return Run(
        run_id=run_id,
        provider=spec.provider,
        source="t",
        spec=spec,
        run_dir="/r",
        output_dir="/r/o",
        state=state,
        **fields,
    )


class RecordingApp(Celery):
    """A Celery app whose send_task records instead of sending (what a dispatcher sends is the test's)."""

    def __init__(self) -> None:
        super().__init__("recorder", set_as_current=False)
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.sent.append((name, kwargs))


def train_job(
    root: Path, config: TrainConfig | None = None, *, cache_dir: Path | None = None, **fields: Any
) -> TrainJob:
    """A TrainJob whose directories live under `root` (work/, out/, and cache/ unless `cache_dir`)."""
    values: dict[str, Any] = {
        "run_id": "run-test",
        "config": config if config is not None else train_config(),
        "work_dir": str(root / "work"),
        "output_dir": str(root / "out"),
        "cache_dir": str(cache_dir if cache_dir is not None else root / "cache"),
    }
    values.update(fields)
    return TrainJob.model_validate(values)


def trainer_command(root: Path, job: TrainJob, **env: str) -> tuple[list[str], dict[str, str]]:
    """`python -m trainer train --job FILE` for `job` (FILE written under `root`) and its environment: this
    process's, without Ray's or the fleet's variables (a test sets those it means), plus `env`."""
    job_file = root / "job.json"
    job_file.write_text(job.to_env(), encoding="utf-8")
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RAY_") and k not in (progress.ENV_VAR, faults.ENV_VAR)
    }
    clean.update(PYTHONUNBUFFERED="1", **env)
    return [sys.executable, "-m", "trainer", "train", "--job", str(job_file)], clean


def write_completion_data(path: Path, count: int) -> Path:
    """A small `completion` JSONL dataset of `count` distinct texts at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": f"A cow says moo {i}."}) + "\n" for i in range(count)))
    return path


class Script:
    """Moves runs through the real ledger, one step (a list of changes) at a time."""

    def __init__(self, client: redis.Redis[str]) -> None:
        self.ledger = Ledger(client)

    def create(self, run_id: str) -> None:
        run = Run(
            run_id=run_id,
            provider="local",
            source="job.yaml",
            spec=job_spec(),
            run_dir="/r",
            output_dir="/out",
        )
        self.ledger.create_run(run, [RunQueued(source=run.source, provider=run.provider)])

    def change(self, run_id: str, fn: Callable[[Run], list[Draft]]) -> None:
        self.ledger.update_run(run_id, fn)

    def to_training(self, run_id: str) -> None:
        def provision(r: Run) -> list[Draft]:
            r.state, r.instance = RunState.PROVISIONING, f"tf-{run_id}-1"
            return [
                StageStarted(stage=Stage.PROVISION),
                InstanceRequested(instance=r.instance, provider=r.provider, price_per_hour=2.5),
            ]

        self.ledger.put_instance(
            Instance(name=f"tf-{run_id}-1", provider="local", run_id=run_id, price_per_hour=2.5)
        )
        self.change(run_id, provision)

        def wandb(r: Run) -> list[Draft]:
            r.progress.wandb = WandbPlan(
                run_id=f"tf-{run_id}", project="p", url=f"https://wandb.example/{run_id}"
            )
            return [WandbRun(run_id=f"tf-{run_id}", project="p", mode="online", url=r.progress.wandb.url)]

        self.change(run_id, wandb)

        def train(r: Run) -> list[Draft]:
            r.state = RunState.TRAINING
            return [StageStarted(stage=Stage.TRAIN)]

        self.change(run_id, train)

    def steps(self, run_id: str, steps: list[int]) -> None:
        for step in steps:

            def one(r: Run, step: int = step) -> list[Draft]:
                r.progress.step, r.progress.total_steps, r.progress.loss = step, 10, 1.0 / step
                return [TrainStep(step=step, loss=1.0 / step, learning_rate=1e-4)]

            self.change(run_id, one)

    def succeed(self, run_id: str) -> None:
        def evaluate(r: Run) -> list[Draft]:
            r.metrics.update(eval_loss_first=2.0, eval_loss=0.5)
            return [TrainEval(eval_loss=0.5)]

        def done(r: Run) -> list[Draft]:
            r.state = RunState.SUCCEEDED
            return [RunSucceeded(output_dir="/out", metrics=r.metrics, hub=None)]

        self.change(run_id, evaluate)
        self.change(run_id, done)

    def fail(self, run_id: str, message: str) -> None:
        def failed(r: Run) -> list[Draft]:
            r.state, r.failure_reason, r.failure_message = (
                RunState.FAILED,
                FailureReason.TRAINING_FAILED,
                message,
            )
            return [RunFailed(reason=FailureReason.TRAINING_FAILED, message=message)]

        self.change(run_id, failed)


LOCAL_SECTION = "local:\n  one_shot: true\n"
# The fake clouds' cheapest fits: RunPod's RTX A5000 (an interruptible pod at its minimum bid) and vast.ai's
# offer 1001 (an RTX A5000 community host: 8 vCPUs, 32 GB).
RUNPOD_SECTION = (
    "runpod:\n  gpu: NVIDIA RTX A5000\n  gpu_count: 1\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
)
VASTAI_SECTION = (
    "vastai:\n  gpu: RTX_A5000\n  gpu_count: 1\n  max_bid_per_gpu: 0.5\n  cloud_type: ALL\n"
    "  min_vcpu_count: 8\n  min_memory_in_gb: 29\n  one_shot: true\n"
)


def light_job_file(folder: Path, section: str = LOCAL_SECTION, extra: str = "") -> Path:
    """The example job trained in one process (`use_ray: false`: no Ray Train start-up), written to
    `folder/tiny.yml` with its data copied beside it; `section` replaces its `local:` section (a runpod: or
    vastai: one) and `extra` adds top-level keys (e.g. `hub_model_id: ...`)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = EXAMPLE_YAML.read_text().replace("use_ray: true", "use_ray: false")
    job = folder / "tiny.yml"
    job.write_text(text.replace(LOCAL_SECTION, extra + section))
    copy_example_data(folder)
    return job


def copy_example_data(folder: Path) -> Path:
    """The example's `data/` copied into `folder` (once), where a job file there names it. A copy, not a
    link: a job's local files must be under its own directory after symlinks (jobs.paths)."""
    data = folder / "data"
    if not data.exists():
        shutil.copytree(EXAMPLE_YAML.parent / "data", data)
    return data


class GitWorkTree:
    """A git repository made in a temporary folder for a test: commands run in it with a fixed identity,
    and `commit` takes everything there (an empty commit when nothing changed)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        ident = ["-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "commit.gpgsign=false"]
        done = subprocess.run(
            ["git", *ident, *args], cwd=self.root, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")
