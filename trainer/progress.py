"""The trainer's progress protocol: one JSON object per stdout line, behind a fixed marker.

Rank 0 prints these lines; the fleet reads them back from the Ray job's logs (which may prefix each
line with the worker's name) and turns each into an event. Keep this module free of heavy imports:
both the node and the workers use it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

MARKER = "@@fleet "
ENV_VAR = "FLEET_TRAIN_JOB"  # the TrainJob JSON travels in this environment variable
NODE_ROOT_ENV = "FLEET_NODE_ROOT"  # the node's directory for runs, caches, outputs (its start script sets it)
PENDING_ENV = "FLEET_TRAIN_PENDING_S"  # how long a Ray job waits for room for its workers (trainer.placement)


class Kind(StrEnum):
    """What a progress line reports."""

    # base model and datasets resolved on the node: {model_path, examples, dataset_files,
    # download: {bytes, files, seconds, mb_per_s, connections, bytes_skipped, repos}}
    FETCHED = "fetched"
    # {total_steps, num_workers, nodes (the Ray node of each rank), num_nodes, train_examples, eval_examples}
    STARTED = "started"
    STEP = "step"  # {step, total_steps, loss, learning_rate, epoch}
    EVAL = "eval"  # {step, eval_loss}
    CHECKPOINT = "checkpoint"  # {step, path}
    RESUMED = "resumed"  # {step, total_steps, path, source}: went on from a checkpoint (source: local|ray)
    ROLLBACK = "rollback"  # {step, to_step, reason, loss (high_loss only), learning_rate, rollbacks}
    BATCH_SIZE = "batch_size"  # {micro_batch_size, gradient_accumulation_steps, tried: [{size, fits}]}
    FINISHED = "finished"  # {metrics: {...}, output_dir}
    # `python -m trainer train`'s last line, once every result is written and reported: what the process does
    # after it (exiting: Python's and torch's teardown, a driver's ray.shutdown) matters to no one
    DONE = "done"
    CHUNK = "chunk"  # {seq, data}: one base64 piece of a packed output directory (trainer.pack)
    PACKED = "packed"  # {bytes, sha256, files, chunks}: the packed output is complete
    # the node's readiness check (trainer.nodecheck): {python, executable, versions, missing, cuda, gpus,
    # gpu_names, bf16, cpu_standin, setup, problems}
    CHECKED = "checked"
    PUSHED = "pushed"  # {repo_id, commit, url}: the results are on the HF Hub (trainer.push)
    # Ray cannot place the training workers yet (trainer.placement): {workers, per_worker, demand, nodes:
    # [{node_id, total, available, fit}], cluster, why, waited_s, limit_s, report (1, 2, ...), gave_up (the
    # last one, then it fails)}
    PENDING = "pending"
    # W&B could not be opened (down, or the key refused since submit): {status: "unavailable", error}; the
    # trainer trains on without it
    WANDB = "wandb"


def emit(kind: Kind, **data: Any) -> None:
    """Print one progress line (call from rank 0 only)."""
    sys.stdout.write(MARKER + json.dumps({"kind": kind.value, **data}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def parse(text: str) -> Iterator[dict[str, Any]]:
    """Yield every progress record found in `text` (whole lines only), skipping malformed ones."""
    for line in text.splitlines():
        at = line.find(MARKER)
        if at < 0:
            continue
        try:
            record = json.loads(line[at + len(MARKER) :])
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("kind") in Kind.__members__.values():
            yield record
