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
    """What a progress line reports; its fields are trainer.lines' model of that kind (CHECKED's,
    trainer.nodecheck's; CHUNK's and PACKED's, trainer.pack's)."""

    FETCHED = "fetched"  # base model and datasets resolved on the node
    STARTED = "started"
    STEP = "step"
    EVAL = "eval"
    CHECKPOINT = "checkpoint"
    RESUMED = "resumed"  # went on from a checkpoint
    ROLLBACK = "rollback"
    BATCH_SIZE = "batch_size"
    FINISHED = "finished"
    # `python -m trainer train`'s last line, once every result is written and reported: what the process does
    # after it (exiting: Python's and torch's teardown, a driver's ray.shutdown) matters to no one
    DONE = "done"
    CHUNK = "chunk"  # one base64 piece of a packed output directory (trainer.pack)
    PACKED = "packed"  # the packed output is complete
    CHECKED = "checked"  # the node's readiness check (trainer.nodecheck)
    PUSHED = "pushed"  # the results are on the HF Hub (trainer.push)
    PENDING = "pending"  # Ray cannot place the training workers yet (trainer.placement)
    WANDB = "wandb"  # W&B could not be opened; the trainer trains on without it
    STOPPED = "stopped"  # told its machine is going, the trainer kept a checkpoint (trainer.stopnotice)


def emit(kind: Kind, **data: Any) -> None:
    """Print one progress line (call from rank 0 only). The trainer's typed lines go through
    trainer.lines.emit; this plain form is for the standard-library programs (trainer.nodecheck) and the
    lines no event reads (CHUNK, PACKED, DONE)."""
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
