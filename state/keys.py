"""Every Redis key, stream and consumer group of the fleet's state, in one place (the Celery queues and task
names are broker.queues')."""

from __future__ import annotations

PREFIX = "tf"

RUNS_INDEX = f"{PREFIX}:runs"  # sorted set: run id -> created_at
RUNS_OPEN = f"{PREFIX}:runs:open"  # set of the runs not ended: the worst cases a budget counts
RUNS_OPEN_BUILT = f"{PREFIX}:runs:open:built"  # set once RUNS_OPEN holds every run (an older ledger's too)
INSTANCES_INDEX = f"{PREFIX}:instances"  # set of instance names ever recorded and not yet settled
EVENTS_STREAM = f"{PREFIX}:events"  # every event of the fleet
REAP_LOCK = f"{PREFIX}:lock:reap"
BUDGET_LOCK = f"{PREFIX}:lock:budget"  # held while a queued run is checked against the caps and started
REAP_SEEN = f"{PREFIX}:reap:seen"  # when a periodic reap task last ran: beat and the reap worker both work
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


# Parked runs (broker.parking): run id -> what it waits for; the lease of the one watcher looking at them.
PARKED = f"{PREFIX}:parked"
WATCHER_LEASE = f"{PREFIX}:lock:watcher"
NODE_SECRETS = f"{PREFIX}:node-secrets"  # hash: a node's tokens (providers.tokens), sealed (providers.sealed)


def worker_key(hostname: str) -> str:
    return f"{WORKERS_PREFIX}{hostname}"


ALIVE_TTL_S = 60  # a process that marks itself alive does so more often than this (`fleet health`)


def alive_key(part: str, hostname: str) -> str:
    """Set (ALIVE_TTL_S) by a fleet process on `hostname` while it works; `fleet health PART` reads it."""
    return f"{PREFIX}:alive:{part}:{hostname}"


# The Discord bot (bot/).
NOTIFIER_GROUP = "notifier"  # the notifier's consumer group on EVENTS_STREAM


def listing_key(provider: str, account: str) -> str:
    """A provider account's instance list, shared by the fleet's processes (providers.listing); `account`
    is a digest, never a credential. `<key>:claim` marks the one process refreshing it."""
    return f"{PREFIX}:listing:{provider}:{account}"


def node_check_key(digest: str) -> str:
    """A readiness check that passed, kept for nodes whose software has the fingerprint `digest` (a hash
    of the provider's software key and the check's command line: workers.readiness)."""
    return f"{PREFIX}:nodecheck:{digest}"


def node_logs_key(run_id: str) -> str:
    """Sorted set: the run's Ray jobs whose output is kept (submission id -> when first kept)."""
    return f"{PREFIX}:nodelogs:{run_id}"


def node_log_key(run_id: str, submission_id: str) -> str:
    """One Ray job's output (its end, redacted): state.nodelogs."""
    return f"{PREFIX}:nodelog:{run_id}:{submission_id}"


def notify_status_key(run_id: str) -> str:
    """The id of a run's status message (in the run's thread, or in the notifier's channel)."""
    return f"{PREFIX}:notify:status:{run_id}"


def notify_thread_key(run_id: str) -> str:
    """The id of a run's thread in the notifier's channel (the id of the message it was started from)."""
    return f"{PREFIX}:notify:thread:{run_id}"


def notify_sent_key(event_id: str) -> str:
    """Set once the separate message of an event was posted (the notifier's dedupe)."""
    return f"{PREFIX}:notify:sent:{event_id}"


def bot_user_runs_key(user_id: int) -> str:
    """A Discord user's runs (sorted set by time): the per-user caps count them."""
    return f"{PREFIX}:bot:user:{user_id}:runs"


def bot_run_owner_key(run_id: str) -> str:
    """The Discord user who started a run (their id): only they may see its node's JupyterLab URL."""
    return f"{PREFIX}:bot:run:{run_id}:owner"


# The git trigger (service/gitwatch.py). `repo` is a repository id (host/owner/name, or a work tree's path).
GIT_INVALID = "invalid"  # a claim's value for a config that was invalid at its commit (seen; never enqueued)


def git_watermark_key(repo: str, branch: str) -> str:
    """The last commit of `branch` the watcher has looked at completely."""
    return f"{PREFIX}:git:seen:{repo}:{branch}"


def git_claim_key(repo: str, commit: str, path: str) -> str:
    """Who enqueues the config at `path` as of `commit`: the run id chosen for it (or GIT_INVALID). Set once
    (SET NX), kept forever: one run per (commit, path)."""
    return f"{PREFIX}:git:claim:{repo}:{commit}:{path}"


def git_lease_key(run_id: str) -> str:
    """Held (with a TTL) by the one process submitting a claimed run right now."""
    return f"{PREFIX}:git:lease:{run_id}"
