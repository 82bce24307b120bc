"""The node's entrypoint: `python -m trainer train|fetch|pack [--job FILE]`.

The TrainJob comes from FILE, or else from the environment variable FLEET_TRAIN_JOB (how the fleet sends
it with a Ray job). `train` resolves the base model once, here on the driver, then trains:

- `use_ray: true`: joins the Ray cluster at RAY_ADDRESS (set by the Ray Jobs API for a job's entrypoint)
  or, without it, starts a private local one; runs Ray Train's TorchTrainer with `ray_num_workers`
  workers, once the cluster can place them (trainer.placement: PENDING lines meanwhile, bounded); Ray's
  storage (checkpoint copies, run state) goes to ``<work_dir>/ray``.
- `use_ray: false`: the same recipe in this process.

A job for axolotl (`trainer: axolotl`) trains with axolotl's own command instead (trainer.axolotl_run);
with `use_ray`, axolotl runs Ray Train itself. A job that only prepares its datasets (`prepare_only`, the
section's prepare_ds_only) tokenizes them into the node's cache in this process and stops
(trainer.prepared; axolotl's `preprocess`).

`fetch` resolves the base model (building the tiny one) and reads the datasets, then prints a FETCHED
progress line; the fleet runs it as the prepare step. For axolotl it checks that the local datasets are
there and counts their records when it can (JSON Lines, JSON); hub datasets are axolotl's to fetch.
`pack` prints the output directory for the fleet to bring back from a rented node (trainer.pack). All exit
0 on success and 1 with a one-line ``trainer: error: ...`` on stderr otherwise. Heavy imports wait until a
command needs them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from trainer import extras, hub_checkpoints, lines, pack, placement, push, verbosity
from trainer.config import AxolotlConfig, TrainConfig, TrainJob
from trainer.errors import JobError, TrainerError, TrainingFailed
from trainer.progress import ENV_VAR, Kind, emit

if TYPE_CHECKING:
    from trainer.download import DownloadStats
    from trainer.outputs import Metrics


def load_job(job_file: Path | None, environ: Mapping[str, str]) -> TrainJob:
    """The TrainJob from `job_file` if given, else from `environ[FLEET_TRAIN_JOB]`. Raises JobError."""
    if job_file is not None:
        try:
            text = job_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise JobError(f"cannot read the job file {job_file}: {exc.strerror or exc}") from exc
        source = str(job_file)
    elif environ.get(ENV_VAR):
        text, source = environ[ENV_VAR], ENV_VAR
    else:
        raise JobError(f"no job: pass --job FILE or set {ENV_VAR}")
    try:
        return TrainJob.from_env(text).on_node(environ)
    except ValidationError as exc:
        raise JobError(f"{source}: not a valid TrainJob:\n{exc}") from exc
    except ValueError as exc:
        raise JobError(f"{source}: {exc}") from exc


def cache_dir(job: TrainJob) -> Path | None:
    return Path(job.cache_dir) if job.cache_dir else None


def fetch(job: TrainJob, base_dir: Path) -> lines.Fetched:
    """Resolve the base model and read every dataset, downloading hub repos into the cache; emit FETCHED
    (the model's path, the examples, the dataset files, what the downloads moved) and return it."""
    from trainer.data import dataset_files, load_records, localize_datasets
    from trainer.download import summary
    from trainer.tiny import fetch_model

    model_path, model_download = fetch_model(job.config.base_model, cache_dir(job))
    config = job.config
    if isinstance(config, AxolotlConfig):
        from trainer import axolotl_run

        found = axolotl_run.local_dataset_files(job, base_dir)
        examples, files = axolotl_run.count_examples(found), [str(f) for f in found]
        downloads: list[DownloadStats] = []
    else:
        datasets, downloads = localize_datasets(config.datasets, base_dir, cache_dir(job))
        examples = len(load_records(datasets, base_dir))
        files = [str(f) for ds in datasets for f in dataset_files(ds, base_dir)]
    download = summary([*([model_download] if model_download else []), *downloads])
    fetched = lines.Fetched(
        model_path=str(model_path), examples=examples, dataset_files=files, download=download
    )
    lines.emit(fetched)
    return fetched


# Ray Train's controller: look at the workers every 0.5 s, not 2 s (a finished run's teardown waits for the
# next look: ~1.5 s sooner); no PreemptionWatcher actor (one more process to start, and it only logs Ray's
# node drains, which nothing here uses: a provider's preemption is the fleet's to see, workers.ending).
RAY_TRAIN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def train(job: TrainJob, base_dir: Path) -> Metrics | dict[str, Any]:
    """Train `job` (with Ray or in this process, per `use_ray`); return the final metrics (in this process)
    or Ray's `Result.metrics` (`train_with_ray`)."""
    from trainer.data import dataset_files, localize_datasets
    from trainer.tiny import resolve_model

    verbosity.announce(job.debug)
    config = job.config
    if isinstance(config, AxolotlConfig):
        from trainer import axolotl_run

        axolotl_run.local_dataset_files(job, base_dir)  # fail fast on a missing file
        model_path = resolve_model(config.base_model, cache_dir(job))
        if job.prepare_only:
            return axolotl_run.preprocess(job, model_path, base_dir)
        return axolotl_run.run(job, model_path, base_dir)
    datasets, _ = localize_datasets(config.datasets, base_dir, cache_dir(job))  # hub ids: + local_copy
    job = job.model_copy(update={"config": config.model_copy(update={"datasets": datasets})})
    for ds in datasets:  # fail fast, before any worker starts, on a missing file
        dataset_files(ds, base_dir)
    model_path = resolve_model(job.config.base_model, cache_dir(job))
    if job.prepare_only:  # tokenize into the cache, in this process: no workers, no GPU
        from trainer import prepared

        return prepared.prepare_only(job, model_path, base_dir)
    Path(job.work_dir).mkdir(parents=True, exist_ok=True)
    hub_checkpoints.fetch_newest(job)  # a new node goes on from the run's last checkpoint on the hub
    if not job.config.use_ray:
        import torch

        from trainer import recipe

        job = without_missing_gpus(job, torch.cuda.device_count())
        return recipe.run(job, model_path, base_dir=base_dir)
    return train_with_ray(job, model_path, base_dir)


def train_with_ray(job: TrainJob, model_path: Path, base_dir: Path) -> dict[str, Any]:
    """Run the recipe as a Ray Train TorchTrainer and return its `Result.metrics` (Ray Train v2: those
    reported with the last checkpoint, {} without one); shut Ray down afterwards if this call started it."""
    # Read when Ray is first imported: keep every worker's progress line instead of folding repeats.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    for name, value in RAY_TRAIN_ENV.items():  # Ray Train passes these on to its controller
        os.environ.setdefault(name, value)
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchTrainer

    from trainer.recipe import loop_config, train_loop_per_worker

    cfg = job.config
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"the builtin recipe cannot run a trainer: {cfg.trainer} job")
    started_here = not ray.is_initialized()
    if started_here:
        if os.environ.get("RAY_ADDRESS"):
            ray.init()  # a Ray Jobs entrypoint: join the job's cluster
        else:
            ray.init(address="local", include_dashboard=False)  # standalone: a private local cluster
    try:
        job = without_missing_gpus(job, float(ray.cluster_resources().get("GPU", 0)))
        resources = cfg.resources_per_worker or ({"GPU": 1.0} if job.use_gpu else {"CPU": 1.0})
        placement.wait_in_ray(cfg.ray_num_workers, resources, job.use_gpu)  # Ray Train would wait silently
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config=loop_config(job, model_path, base_dir),
            scaling_config=ScalingConfig(
                num_workers=cfg.ray_num_workers, resources_per_worker=resources, use_gpu=job.use_gpu
            ),
            run_config=RunConfig(
                name=cfg.ray_run_name or f"trainfleet-{job.run_id}",
                storage_path=str(Path(job.work_dir) / "ray"),
                # A failed worker group starts again from the last reported checkpoint (trainer.resume).
                failure_config=FailureConfig(max_failures=cfg.ray_max_failures),
                checkpoint_config=extras.ray_checkpoint_config(cfg),  # save_total_limit in Ray's copy too
            ),
        )
        try:
            result = trainer.fit()
        except TrainingFailedError as exc:
            raise TrainingFailed(f"Ray Train failed: {worker_failure(exc)}") from exc
        return dict(result.metrics or {})
    finally:
        if started_here:
            ray.shutdown()


def without_missing_gpus(job: TrainJob, gpus: float) -> TrainJob:
    """The job as this node can run it: a node without GPUs (a cloud's fake, a CPU box) trains on its
    CPUs, with a warning, rather than waiting forever for GPUs Ray will never grant."""
    if job.use_gpu and gpus <= 0:
        print(
            "trainer: warning: the job asks for GPUs but this node has none; training on CPUs",
            file=sys.stderr,
        )
        return job.model_copy(update={"use_gpu": False})
    return job


def worker_failure(exc: BaseException) -> str:
    """One line for a failed Ray Train run: the lowest failed rank's own exception when there is one
    (Ray's log above it keeps the full tracebacks), else the first line of Ray's message."""
    failures: dict[int, BaseException] = getattr(exc, "worker_failures", None) or {}
    if failures:
        rank = min(failures)
        cause = getattr(failures[rank], "cause", None) or failures[rank]  # unwrap a RayTaskError
        message = str(cause).strip().splitlines()
        return f"worker rank {rank}: {type(cause).__name__}: {message[-1] if message else ''}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m trainer", description="trainfleet's node-side trainer")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("train", "train the job's LoRA adapter"),
        ("fetch", "resolve the model and data"),
        ("pack", "print the output directory as progress lines, for the fleet to bring back"),
        ("push", "upload the output directory to the job's hub_model_id"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--job", type=Path, default=None, help=f"TrainJob JSON file (default: ${ENV_VAR})")
        if name == "pack":
            sub.add_argument("--limit-bytes", type=int, default=pack.DEFAULT_LIMIT_BYTES)
            sub.add_argument("--skip-over-limit", action="store_true", help="say so instead of failing")
    args = parser.parse_args(argv)
    try:
        job = load_job(args.job, os.environ)
        base_dir = Path.cwd()
        if args.command == "fetch":
            fetch(job, base_dir)
        elif args.command == "pack":
            pack.pack(Path(job.output_dir), args.limit_bytes, args.skip_over_limit)
        elif args.command == "push":
            push.push(job)
        else:
            train(job, base_dir)
            emit(Kind.DONE)  # the fleet goes on from here, not from this process's end (seconds later)
    except TrainerError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("trainer: interrupted", file=sys.stderr)
        return 130
    return 0
