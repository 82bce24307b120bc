"""The node's errors. The entrypoint prints them as one clear line and exits non-zero.

The node cannot import core.errors (it does not travel to the node), so this is a small tree of its own;
none of these is worth retrying on the same node with the same job.
"""

from __future__ import annotations


class TrainerError(Exception):
    """Base of every error the trainer raises on purpose."""


class JobError(TrainerError):
    """The TrainJob is missing or does not validate."""


class ModelUnavailable(TrainerError):
    """The base model is not built in, not a local directory, and cannot be downloaded from the hub."""


class DownloadError(TrainerError):
    """A hub repo cannot be listed or fetched: missing, refused, or a transfer failed past its retries."""


class DatasetError(TrainerError):
    """A dataset cannot be found or read, or a record lacks the fields its type needs."""


class TrainingFailed(TrainerError):
    """Training itself failed (a worker raised, or the loss became NaN)."""


class ResourcesUnavailable(TrainerError):
    """Ray cannot place the training workers on the cluster's nodes, and did not within the fleet's bound."""


class PackError(TrainerError):
    """A run's results cannot be brought back: too large for the job log, or damaged on the way."""
