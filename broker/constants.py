"""Every Redis key, stream, queue and task name the fleet uses, in one place."""

from __future__ import annotations

from enum import StrEnum

PREFIX = "tf"


class Stage(StrEnum):
    """A run's stages; each is a Celery queue of the same name with one task."""

    PROVISION = "provision"
    PREPARE = "prepare"
    TRAIN = "train"
    FINALIZE = "finalize"

    @property
    def task_name(self) -> str:
        return f"trainfleet.{self.value}"


REAP_QUEUE = "reap"
REAP_TASK = "trainfleet.reap"
QUEUES: tuple[str, ...] = (*(s.value for s in Stage), REAP_QUEUE)

RUNS_INDEX = f"{PREFIX}:runs"  # sorted set: run id -> created_at
INSTANCES_INDEX = f"{PREFIX}:instances"  # set of instance names ever recorded and not yet settled
EVENTS_STREAM = f"{PREFIX}:events"  # every event of the fleet
REAP_LOCK = f"{PREFIX}:lock:reap"
SWEEPS_INDEX = f"{PREFIX}:sweeps"  # sorted set: sweep id -> created_at
SWEEPS_ACTIVE = f"{PREFIX}:sweeps:active"  # set of sweeps not yet finished (the reaper advances them)
WORKERS_PREFIX = f"{PREFIX}:worker:"


def run_key(run_id: str) -> str:
    return f"{PREFIX}:run:{run_id}"


def instance_key(name: str) -> str:
    return f"{PREFIX}:instance:{name}"


def run_events_key(run_id: str) -> str:
    """One stream per run, so `fleet logs RUN` reads only its own events."""
    return f"{PREFIX}:events:{run_id}"


def sweep_key(sweep_id: str) -> str:
    return f"{PREFIX}:sweep:{sweep_id}"


def sweep_lock_key(sweep_id: str) -> str:
    """Held while one process releases a sweep's waiting children (so max_parallel holds)."""
    return f"{PREFIX}:lock:sweep:{sweep_id}"


def tick_key(run_id: str) -> str:
    """Who owns the run's chain of stage tasks: the id of the one task allowed to act next."""
    return f"{PREFIX}:tick:{run_id}"


def worker_key(hostname: str) -> str:
    return f"{WORKERS_PREFIX}{hostname}"
