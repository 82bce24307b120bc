"""One error tree for the whole fleet. Each class says whether trying again can help."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FailureReason(StrEnum):
    """Why a run ended FAILED (or CANCELLED)."""

    NO_CAPACITY = "NO_CAPACITY"
    PROVISIONING_FAILED = "PROVISIONING_FAILED"
    NODE_TIMEOUT = "NODE_TIMEOUT"
    NODE_BROKEN = "NODE_BROKEN"  # the node cannot train: its readiness check names what is missing
    NODE_UNREACHABLE = "NODE_UNREACHABLE"  # the node's TLS certificate failed the fleet's check: named
    INSTANCE_LOST = "INSTANCE_LOST"
    ENTRY_FAILED = "ENTRY_FAILED"  # the job's `entry` script exited non-zero on the node (not retried)
    PREPARE_FAILED = "PREPARE_FAILED"
    TRAINING_FAILED = "TRAINING_FAILED"
    RESOURCES_UNAVAILABLE = "RESOURCES_UNAVAILABLE"  # Ray could not place the training workers in time
    FINALIZE_FAILED = "FINALIZE_FAILED"
    CANCELLED_BY_USER = "CANCELLED_BY_USER"
    OVER_BUDGET = "OVER_BUDGET"
    DEADLINE = "DEADLINE"  # the node reached its terminate_after
    AUTH_FAILED = "AUTH_FAILED"  # a provider refused the fleet's credential, or none is configured
    STALLED = "STALLED"  # its stage task kept starting and dying without finishing a step (the reaper)
    INTERNAL_ERROR = "INTERNAL_ERROR"


class Unreachable(StrEnum):
    """Why the fleet's call to a node's Ray head got no answer (providers.node.reach). `permanent`: a
    certificate the fleet's check refuses, which waiting does not heal; the others are a booting node's."""

    CERTIFICATE = "certificate"  # not signed by an authority trusted for it (expired, self-signed, unknown)
    HOSTNAME = "hostname"  # valid, but for another name than the one the fleet called
    PIN = "pin"  # not the certificate the fleet made and pinned for the node
    TLS = "tls"  # the handshake failed otherwise (cut short, not TLS on that port)
    REFUSED = "refused"  # nothing listens on the port yet
    CLOSED = "closed"  # the connection was taken and closed without an answer (a front before its node)
    TIMEOUT = "timeout"  # no connection, or no answer, in time
    NETWORK = "network"  # no way to the address (its name does not resolve, no route)
    HTTP = "http"  # an answer, but not the Jobs API's (a proxy's 502 or 404 while the node boots, a 401)

    @property
    def permanent(self) -> bool:
        return self in (Unreachable.CERTIFICATE, Unreachable.HOSTNAME, Unreachable.PIN)


class FleetError(Exception):
    """Base of every error trainfleet raises on purpose. The class says what a stage does with it: retry
    it (`retryable`, with back-off, for a bounded time), or end the run at once; and with which reason the
    run fails (`failure`; None: the stage's own, e.g. PROVISIONING_FAILED)."""

    retryable = False
    failure: FailureReason | None = None


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where (a dotted key path and a line) and what."""

    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.path or "<file>"
        at = f" (line {self.line})" if self.line is not None else ""
        return f"{where}{at}: {self.message}"


class ConfigError(FleetError):
    """A job file, settings file or argument is invalid; nothing was enqueued."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")


class NotFound(FleetError):
    """A run, instance or file that was asked for does not exist."""


class AlreadyExists(FleetError):
    """A record with that id is in the ledger already (never overwritten)."""


class OverBudget(FleetError):
    """A cap on spending is reached: nothing new is started (the message has the figures)."""


class CredentialsMissing(FleetError):
    """A provider's credential is not configured (named, never shown)."""

    failure = FailureReason.AUTH_FAILED


class SealMismatch(CredentialsMissing):
    """A node's secret in the fleet's Redis was sealed under another seal key than this machine's."""


class ProviderError(FleetError):
    """A provider call failed."""

    made_nothing = False
    """On a failed launch: whether it surely made nothing, so a create may be asked again at once (the
    vendor said no, or the launch failed before its create call). False: the instance may exist."""


class ProviderUnavailable(ProviderError):
    """The provider's API is down, rate limited or timed out; try again later (after `retry_after`
    seconds when the provider said how long)."""

    retryable = True

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NoCapacity(ProviderError):
    """No offer fits the job's section right now."""

    retryable = True
    failure = FailureReason.NO_CAPACITY


class MachinesHeld(NoCapacity):
    """Every machine that fits is held by other runs (the operator's pool): the run waits for one for as
    long as that takes, which is no failure counted against its retries."""


class ProvisioningFailed(ProviderError):
    """The instance could not be brought up."""


class AuthFailed(ProviderError):
    """The provider refused the credential (its words in the message, never the credential)."""

    failure = FailureReason.AUTH_FAILED


class StageFailed(FleetError):
    """A stage found that the run cannot go on; carries the failure reason. `keep` False: its nodes are
    terminated even when the job would keep them for debugging (a node that cannot train is no use)."""

    def __init__(self, reason: FailureReason, message: str, keep: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.keep = keep


class NodeLost(FleetError):
    """The run's node is gone from under it (preempted, outbid, no longer listed): replace it.
    `at_boot`: it stopped before it ever came up (a spot machine outbid, or one whose image could not be
    pulled: the cloud does not say which)."""

    def __init__(self, message: str, at_boot: bool = False) -> None:
        super().__init__(message)
        self.at_boot = at_boot


class LeaseLost(FleetError):
    """A stage task's claim on its run was taken over (it stalled past its TTL and another task owns the
    run now): its writes are refused, and it stands down without touching the run or its nodes."""


class GitError(FleetError):
    """A git command failed: not a repository, an unknown branch or commit, a fetch that did not work."""


class NodeError(FleetError):
    """The node's Ray head did not answer or refused a request."""

    retryable = True


class StepTimedOut(FleetError):
    """A stage's step ran past its task's soft time limit (a call that hung): the step is tried again."""

    retryable = True


# What Celery's autoretry_for may retry: only errors that say trying again can help.
RETRYABLE: tuple[type[FleetError], ...] = (ProviderUnavailable, NoCapacity, NodeError, StepTimedOut)


def clipped(message: str, limit: int) -> str:
    """`message` in at most `limit` characters: its first line (what failed), a line `…` for what is left
    out, and as many of its last lines as fit (why: a traceback ends with its cause), whole lines only but
    for a last line longer than the room left, whose end is kept."""
    if len(message) <= limit:
        return message
    lines = message.splitlines()
    first = lines[0][: limit // 3]
    room = limit - len(first) - 3  # the two newlines around the ellipsis line
    tail: list[str] = []
    for line in reversed(lines[1:]):
        if len(line) + 1 > room:
            break
        tail.insert(0, line)
        room -= len(line) + 1
    if not tail:
        tail = [message[-(room - 1) :].lstrip("\n")] if room > 1 else []
    return "\n".join([first, "…", *tail])
