"""A job for axolotl (`trainer: axolotl`): axolotl's own `train` on this node, every fleet feature kept.

`node_config` turns the job's config into the one axolotl runs here: the job's keys as written (less the
fleet's own, FLEET_KEYS), with the node's paths (the base model the prepare stage fetched, output_dir,
dataset_prepared_path under the node's cache, shipped datasets made absolute, the section's DeepSpeed and
eval-table switches), the fleet's W&B run, the fleet's plugin (trainfleet's progress lines, loss
watchdog, eval samples, final metrics: trainer/axolotl_plugin.py), and auto-resume from the newest
checkpoint-N in output_dir (a restarted or replacement node goes on).

`run` writes it to `<work_dir>/axolotl.yml`, runs `python -m axolotl.cli.main train` in a child process
(its output goes straight to this job's log), then finishes as the builtin recipe does: the adapter's
base model set to the job's hub id, metrics.json, the model card, a FINISHED line. `preprocess` (the
section's prepare_ds_only) runs axolotl's `preprocess` instead and reports what it prepared. Nothing here
imports axolotl, so the fleet's environment can test it.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from trainer import card, lines
from trainer.config import FLEET_KEYS, HUB_ID_PATTERN, AxolotlConfig, TrainJob
from trainer.data import every_file
from trainer.errors import DatasetError, TrainingFailed
from trainer.progress import ENV_VAR

CONFIG_FILE = "axolotl.yml"  # under work_dir: what axolotl ran with
RESULT_FILE = "axolotl-result.json"  # under work_dir: what the plugin found (watchdog, final metrics)
RESULT_ENV = "FLEET_AXOLOTL_RESULT"  # names the result file for the plugin
PLUGIN = "trainer.axolotl_plugin.TrainfleetPlugin"
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow", ".txt", ".gz", ".zst")
PREPARED_DIR = "axolotl-prepared"  # dataset_prepared_path's default, under the node's cache
ZERO2_CONFIG = Path(__file__).parent / "assets" / "deepspeed_zero2.json"  # the section's deepspeed: true
# axolotl turns these on by itself for LoRA, and they need CUDA (axolotl/kernels/*.py).
CUDA_KERNELS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel")
# The fleet pushes the result at finalize, with its own model card (trainer.push): axolotl must not push.
HUB_KEYS = ("hub_model_id", "hub_strategy", "hub_private_repo")
WANDB_FROM_PLAN = ("wandb_project", "wandb_entity", "wandb_name", "wandb_run_id", "wandb_mode", "use_wandb")


def node_config(job: TrainJob, model_path: Path, base_dir: Path, cuda: bool) -> dict[str, Any]:
    """The axolotl config this node runs for `job` (see the module docstring); `model_path` is the local
    base model, `base_dir` the directory shipped datasets are relative to (the Ray job's working_dir)."""
    config = _axolotl(job)
    out = {k: v for k, v in config.model_dump(mode="json", exclude_none=True).items() if k not in FLEET_KEYS}
    for key in HUB_KEYS:
        out.pop(key, None)
    out["base_model"] = str(model_path)  # the original id stays in the job, for the card and the adapter
    out["output_dir"] = job.output_dir
    out["datasets"] = [_local_paths(ds, base_dir) for ds in out["datasets"]]
    out["dataset_prepared_path"] = str(prepared_path(job))
    if job.deepspeed:  # the section's deepspeed: true (jobs.switches refused a config's own beside it)
        out["deepspeed"] = str(ZERO2_CONFIG)
    if job.log_eval is False:  # the section turned the eval samples table off: axolotl's own too
        out.pop("eval_table_size", None)
    _wandb(out, job)
    plugins = list(out.get("plugins") or [])
    out["plugins"] = plugins if PLUGIN in plugins else [*plugins, PLUGIN]
    if out.get("resume_from_checkpoint") is None and out.get("auto_resume_from_checkpoints") is None:
        out["auto_resume_from_checkpoints"] = True  # a restarted or replacement node goes on from the newest
    if not cuda:
        off = [key for key in CUDA_KERNELS if out.get(key) is None]
        for key in off:
            out[key] = False
        if off:
            print(
                f"trainer: warning: no CUDA on this node: {', '.join(off)} set to false (axolotl's LoRA "
                "kernels need CUDA)",
                file=sys.stderr,
            )
    return out


def prepared_path(job: TrainJob) -> Path:
    """Where axolotl keeps the tokenized datasets: the config's dataset_prepared_path (a relative one, or
    none: PREPARED_DIR) under the node's cache, which outlives the run, so a later run of the same
    datasets finds them (axolotl names each preparation by a digest of its datasets and tokenizer);
    without a cache, under work_dir. An absolute one stays itself."""
    given = _axolotl(job).model_extra or {}
    base = Path(job.cache_dir or job.work_dir)
    return base / str(given.get("dataset_prepared_path") or PREPARED_DIR)


def _axolotl(job: TrainJob) -> AxolotlConfig:
    if not isinstance(job.config, AxolotlConfig):
        raise TypeError(f"not an axolotl job (trainer: {job.config.trainer})")
    return job.config


def _local_paths(ds: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """A dataset entry with its path made absolute when it is on this disk (hub ids are left as they are)."""
    path = Path(str(ds["path"])).expanduser()
    local = path if path.is_absolute() else base_dir / path
    return {**ds, "path": str(local.resolve())} if local.exists() else ds


def _wandb(out: dict[str, Any], job: TrainJob) -> None:
    """W&B as the fleet planned it (axolotl logs into the run the fleet announced), or none at all."""
    plan = job.wandb
    for key in [k for k in out if k.startswith("wandb_") or k == "use_wandb"]:
        if plan is None or key in WANDB_FROM_PLAN:
            out.pop(key, None)  # with a plan, wandb_watch and wandb_log_model stay the job's
    if plan is None:
        return
    out.update(wandb_project=plan.project, wandb_run_id=plan.run_id, wandb_mode=plan.mode)
    out["wandb_name"] = plan.name or f"trainfleet {job.run_id}"
    if plan.entity:
        out["wandb_entity"] = plan.entity


def child_env(job: TrainJob, result: Path, environ: dict[str, str]) -> dict[str, str]:
    """The environment axolotl runs in: this one, this interpreter's bin dir first on PATH (axolotl looks
    `accelerate` up there), the trainer package importable (the plugin), no telemetry unless asked, the job
    and the result file for the plugin, and the W&B run's settings."""
    env = dict(environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]).rstrip(os.pathsep)
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    env.setdefault("AXOLOTL_DO_NOT_TRACK", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env[ENV_VAR] = job.to_env()
    env[RESULT_ENV] = str(result)
    if job.wandb is not None:
        env.setdefault("WANDB_DIR", job.work_dir)
        env.setdefault("WANDB_SILENT", "true")
        if job.wandb.mode == "online":  # an offline run cannot be resumed (trainer.tracking)
            env["WANDB_RESUME"] = "allow"
        if job.wandb.group:
            env["WANDB_RUN_GROUP"] = job.wandb.group
    return env


def command(config_file: Path, use_ray: bool, verb: str = "train") -> list[str]:
    """axolotl's `verb` command for `config_file` (train, or preprocess; `--use-ray`: Ray Train's
    TorchTrainer, GPUs only)."""
    return [
        sys.executable,
        "-m",
        "axolotl.cli.main",
        verb,
        str(config_file),
        *(["--use-ray"] if use_ray else []),
    ]


def _launch(
    job: TrainJob, model_path: Path, base_dir: Path, verb: str, use_ray: bool
) -> tuple[int, dict[str, Any], Path]:
    """Write the node's axolotl config to `<work_dir>/axolotl.yml` and run axolotl's `verb` on it in a
    child process (its output straight to this job's log); its exit code, the config, and the result file
    the fleet's plugin writes (an earlier attempt's removed first)."""
    import torch

    work = Path(job.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    config_file, result_file = work / CONFIG_FILE, work / RESULT_FILE
    config = node_config(job, model_path, base_dir, torch.cuda.is_available())
    config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    result_file.unlink(missing_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = command(config_file, use_ray, verb)
    code = subprocess.call(argv, cwd=base_dir, env=child_env(job, result_file, dict(os.environ)))
    return code, config, result_file


def preprocess(job: TrainJob, model_path: Path, base_dir: Path) -> dict[str, Any]:
    """Tokenize `job`'s datasets with axolotl's `preprocess` into dataset_prepared_path (the node's cache)
    and stop: prepared.json and a FINISHED line whose metrics count the prepared rows. Raises
    TrainingFailed when axolotl fails."""
    from trainer import prepared

    code, config, _ = _launch(job, model_path, base_dir, "preprocess", use_ray=False)
    if code != 0:
        raise TrainingFailed(f"axolotl preprocess exited with code {code} (its log above says why)")
    where = Path(config["dataset_prepared_path"])
    metrics = {"prepared_rows": prepared_rows(where)}
    prepared.report(job, metrics, {"cache": str(where)})
    return metrics


def prepared_rows(where: Path) -> int:
    """The rows axolotl's newest preparation under `where` holds (its Arrow dataset's own count)."""
    from datasets import load_from_disk  # type: ignore[import-untyped]

    found = [p for p in where.iterdir() if p.is_dir()] if where.is_dir() else []
    if not found:
        raise TrainingFailed(f"axolotl preprocess finished but left nothing in {where}")
    newest = max(found, key=lambda p: p.stat().st_mtime)
    return int(load_from_disk(str(newest)).num_rows)


def run(job: TrainJob, model_path: Path, base_dir: Path) -> dict[str, Any]:
    """Train `job` with axolotl and finish its output directory; return the final metrics. Raises
    TrainingFailed when axolotl fails, the loss watchdog stopped it, or the fleet's plugin did not run."""
    code, _, result_file = _launch(job, model_path, base_dir, "train", use_ray=_axolotl(job).use_ray)
    result = read_result(result_file)
    if (trip := result.get("watchdog")) is not None:
        raise TrainingFailed(describe_trip(trip))
    if code != 0:
        raise TrainingFailed(f"axolotl exited with code {code} (its log above says why)")
    if "metrics" not in result:
        raise TrainingFailed(
            f"axolotl finished but trainfleet's plugin reported nothing ({result_file} has no metrics): "
            f"was {PLUGIN} loaded? (axolotl's log above says)"
        )
    metrics: dict[str, Any] = dict(result["metrics"])
    finish(job, metrics)
    return metrics


def read_result(path: Path) -> dict[str, Any]:
    """The plugin's result file ({} when it is missing or unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_trip(trip: dict[str, Any]) -> str:
    """The watchdog's stop as one line: which loss, against what threshold and patience, at which step."""
    loss, step = trip.get("loss"), trip.get("step")
    if not isinstance(loss, int | float) or not math.isfinite(loss):
        return f"loss watchdog: the logged loss was {loss} at step {step}; training stopped"
    return (
        f"loss watchdog: the logged loss was above loss_watchdog_threshold {trip.get('threshold')} for "
        f"loss_watchdog_patience {trip.get('patience')} logged steps in a row ({loss:.6g} at step {step}); "
        "training stopped"
    )


def finish(job: TrainJob, metrics: dict[str, Any]) -> None:
    """The output directory as the builtin recipe leaves it: the adapter's base model named by its hub id
    (not this node's path), metrics.json, the model card; then the FINISHED line."""
    import importlib.metadata

    config = _axolotl(job)
    out = Path(job.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    targets: list[str] = []
    adapter_config = out / "adapter_config.json"
    if adapter_config.is_file():
        data = json.loads(adapter_config.read_text(encoding="utf-8"))
        data["base_model_name_or_path"] = config.base_model
        adapter_config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        found = data.get("target_modules") or []
        targets = sorted(found) if isinstance(found, list) else [str(found)]
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    try:
        version: str | None = importlib.metadata.version("axolotl")
    except importlib.metadata.PackageNotFoundError:
        version = config.axolotl_version
    text = card.render(
        config,
        metrics,
        run_id=job.run_id,
        target_modules=targets,
        job_yaml=job.job_yaml,
        wandb_url=job.wandb.url if job.wandb else None,
        trainer_version=version,
    )
    card.write(out / "README.md", text)
    lines.emit(lines.Finished(metrics=metrics, output_dir=str(out)))


def local_dataset_files(job: TrainJob, base_dir: Path) -> list[Path]:
    """The files of the job's local datasets (hub datasets are axolotl's to fetch). Raises DatasetError for
    a path that is neither on this disk nor a hub id, or `data_files` missing from a local directory."""
    files: list[Path] = []
    for ds in _axolotl(job).datasets:
        path = Path(ds.path).expanduser()
        local = path if path.is_absolute() else base_dir / path
        if not local.exists():
            if is_hub_id(ds.path):
                continue
            raise DatasetError(f"dataset {ds.path!r} not found at {local}, and it is not a hub id")
        files += every_file(ds, local)
    return files


def is_hub_id(path: str) -> bool:
    """Whether a dataset path not on this disk reads as a hub id: 'org/name', not a file like x.jsonl."""
    suffix = Path(path).suffix.lower()
    return (
        bool(re.fullmatch(HUB_ID_PATTERN, path))
        and not path.startswith((".", "~"))
        and suffix not in DATA_SUFFIXES
    )


def count_examples(files: list[Path]) -> int | None:
    """Records in JSON Lines and JSON-array files (None when a file is in another format, or unreadable)."""
    total = 0
    for f in files:
        if f.suffix not in (".jsonl", ".json"):
            return None
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        try:
            data = json.loads(text) if f.suffix == ".json" else None
        except ValueError:
            data = None  # JSON Lines under a .json name, as axolotl's `ds_type: json` reads them
        total += len(data) if isinstance(data, list) else sum(1 for line in text.splitlines() if line.strip())
    return total
