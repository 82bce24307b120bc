"""Where a recipe runs: one plain process, or one Ray Train worker of several (gloo on CPU, NCCL on GPU).

The recipe talks to this module instead of to Ray or torch.distributed directly, so that the same loop
runs in both places. Under Ray every collective here (`all_reduce_sum`, `all_reduce_max`, `gather_text`,
`all_true`, `same_everywhere`, `report`) is a barrier: every worker must call it the same number of times,
in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import torch

    from trainer.outputs import Metrics


class CheckpointMetrics(TypedDict):
    """What every worker reports to Ray Train with a checkpoint."""

    step: int
    eval_loss: float | None


@dataclass(frozen=True)
class Worker:
    """This process's place in the run."""

    rank: int
    world_size: int
    device: torch.device
    under_ray: bool
    node_id: str = "local"
    """The Ray node this worker runs on (Ray's own id for it), or "local" without Ray."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the only worker that prints progress and writes files."""
        return self.rank == 0


def current_worker(use_gpu: bool, under_ray: bool) -> Worker:
    """Describe this process. Under Ray the rank, world size and device come from Ray Train's context
    (it has already set up the process group); otherwise rank 0 of 1, on the first GPU if `use_gpu`."""
    import torch

    if under_ray:
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        node = ray.get_runtime_context().get_node_id()
        return Worker(ctx.get_world_rank(), ctx.get_world_size(), ray.train.torch.get_device(), True, node)
    if use_gpu and not torch.cuda.is_available():
        from trainer.errors import TrainingFailed

        raise TrainingFailed("the job asks for a GPU (use_gpu) but torch sees none")
    return Worker(0, 1, torch.device("cuda" if use_gpu else "cpu"), False)


def all_reduce_sum(values: list[float], worker: Worker) -> list[float]:
    """Element-wise sum of `values` over all workers (the values themselves with one worker)."""
    if worker.world_size == 1:
        return list(values)
    import torch
    import torch.distributed as dist

    # NCCL needs the tensor on the GPU; gloo takes it on the CPU. float64 keeps token counts exact.
    tensor = torch.tensor(values, dtype=torch.float64, device=worker.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.tolist()]


def all_reduce_max(values: list[float], worker: Worker) -> list[float]:
    """Element-wise maximum of `values` over all workers (the values themselves with one worker)."""
    if worker.world_size == 1:
        return list(values)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=worker.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(v) for v in tensor.tolist()]


def gather_text(value: str, worker: Worker) -> list[str]:
    """Every worker's `value`, in rank order; every worker gets the list (one collective)."""
    if worker.world_size == 1:
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * worker.world_size
    dist.all_gather_object(values, value)
    return [str(v) for v in values]


def all_true(flag: bool, worker: Worker) -> bool:
    """Whether `flag` holds on every worker; every worker gets the same answer (one collective)."""
    return all_reduce_max([0.0 if flag else 1.0], worker)[0] == 0.0


def same_everywhere(value: float, worker: Worker) -> bool:
    """Whether every worker passed the same `value`; every worker gets the same answer (one collective)."""
    highest, minus_lowest = all_reduce_max([value, -value], worker)
    return highest == -minus_lowest


def prepare_model(model: Any, worker: Worker) -> Any:
    """Move `model` to the worker's device; under Ray with several workers, wrap it in DDP."""
    if not worker.under_ray:
        return model.to(worker.device)
    import inspect

    import ray.train.torch
    from torch.nn.parallel import DistributedDataParallel

    # Buffers (rotary frequencies) are equal on every rank; not syncing them on each forward saves one
    # collective per step. (torch 2.13 renamed the flag; older versions only know broadcast_buffers.)
    flags = inspect.signature(DistributedDataParallel.__init__).parameters
    flag = "forward_sync_buffers" if "forward_sync_buffers" in flags else "broadcast_buffers"
    return ray.train.torch.prepare_model(model, parallel_strategy_kwargs={flag: False})


def unwrap(model: Any) -> Any:
    """The model inside a DDP wrapper (or the model itself)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def report(worker: Worker, metrics: Metrics | CheckpointMetrics, checkpoint_dir: Path | None = None) -> None:
    """Under Ray, report `metrics` (and rank 0's `checkpoint_dir`, copied into the run's storage) to Ray
    Train. A barrier: every worker calls it, with a checkpoint only on rank 0. A no-op without Ray."""
    if not worker.under_ray:
        return
    import ray.train

    checkpoint = None
    if checkpoint_dir is not None and worker.is_main:
        checkpoint = ray.train.Checkpoint.from_directory(str(checkpoint_dir))
    name = checkpoint_dir.name if checkpoint is not None and checkpoint_dir is not None else None
    ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name)


@contextmanager
def restored_checkpoint(worker: Worker) -> Iterator[Path | None]:
    """Under Ray, the directory of the checkpoint Ray Train restores this run from: the last one reported,
    after a worker failure (FailureConfig.max_failures) or for a run created again under the same name and
    storage. None without one, or without Ray. The directory may be temporary: read it inside the block."""
    if not worker.under_ray:
        yield None
        return
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as directory:
        yield Path(directory)
