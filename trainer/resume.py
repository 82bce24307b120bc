"""Where a run resumes from: the newest complete checkpoint, Ray's or this node's.

Under Ray Train, `ray.train.get_checkpoint()` gives a restarted worker group (FailureConfig.max_failures),
or a run created again under the same name and storage, the last checkpoint it reported. The newest
complete ``<work_dir>/checkpoints/step-N`` counts too, with or without Ray: a job started again on the
same node (in-process, or after Ray gave up) goes on from there, and rank 0 writes it just before reporting
it, so it can be one checkpoint ahead of Ray's after a crash in between. The newer wins, Ray's on a tie.
Every rank must resume from the same step; they check that with one collective.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice
from pathlib import Path
from typing import Any

from trainer import dist, lines, outputs
from trainer.errors import TrainingFailed
from trainer.snapshot import Snapshot


class Source(StrEnum):
    """Who kept the checkpoint a run resumed from."""

    LOCAL = "local"  # <work_dir>/checkpoints on this node
    RAY = "ray"  # Ray Train's storage, through ray.train.get_checkpoint()


@dataclass(frozen=True)
class Resume:
    """A checkpoint read back, ready to restore."""

    snapshot: Snapshot
    state: outputs.TrainerState  # its trainer_state.json (the run's shape as well as its position)
    source: Source
    location: str  # the directory it was read from

    @property
    def step(self) -> int:
        return self.snapshot.position.step

    def line(self, total_steps: int) -> lines.Resumed:
        """The RESUMED line that says it, in a run of `total_steps`."""
        return lines.Resumed(
            step=self.step, total_steps=total_steps, path=self.location, source=self.source.value
        )


def find(work_dir: Path, worker: dist.Worker) -> Resume | None:
    """The checkpoint this run resumes from, read into memory; None for a fresh start. A collective."""
    candidates: list[tuple[int, int, Source, Path]] = []
    local = outputs.latest_checkpoint(work_dir / outputs.CHECKPOINTS_DIR)
    if local is not None:
        candidates.append((outputs.read_state(local)["global_step"], 0, Source.LOCAL, local))
    found = None
    with dist.restored_checkpoint(worker) as ray_dir:
        if ray_dir is not None and outputs.is_complete(ray_dir):
            candidates.append((outputs.read_state(ray_dir)["global_step"], 1, Source.RAY, ray_dir))
        if candidates:
            _, _, source, directory = max(candidates, key=lambda c: (c[0], c[1]))
            snapshot = outputs.load_checkpoint(directory)
            found = Resume(snapshot, outputs.read_state(directory), source, str(directory))
    step = -1 if found is None else found.step
    if not dist.same_everywhere(float(step), worker):
        raise TrainingFailed(
            f"the workers found different checkpoints to resume from (rank {worker.rank}: step {step}); "
            f"do they all see {work_dir / outputs.CHECKPOINTS_DIR}?"
        )
    return found


class ShardFrom:
    """A worker's shard of the training set (a DistributedSampler: each epoch's order comes from the seed and
    the epoch) that starts `skip` samples in: the loader's sampler, so a run resumed (or rolled back) in
    the middle of an epoch skips the micro batches already done without loading them."""

    def __init__(self, shard: Any) -> None:
        self.shard, self.skip = shard, 0

    def set_epoch(self, epoch: int) -> None:
        self.shard.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return islice(iter(self.shard), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.shard) - self.skip)
