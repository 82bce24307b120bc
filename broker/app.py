"""The Celery app: queues per stage, late acks, prefetch 1, and the reaper on beat.

The app object exists at import (Celery needs one to register tasks) but holds no configuration until
`configure(settings)` is called once per process by whoever starts it (the CLI, a worker, a test).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from celery import Celery
from kombu import Exchange, Queue

from broker.queues import QUEUES, REAP_AT_TASK, REAP_QUEUE, REAP_TASK
from core import redisurl
from state.stages import STAGES, Stage

if TYPE_CHECKING:
    from core.settings import Settings

TASK_MODULES = [*(facts.module for facts in STAGES.values()), "workers.stages.reap"]
# Long enough that no task (each is a short step) is redelivered while still running; a worker that
# died leaves its message to the reaper's kick long before this. Never shorter than the longest task's hard
# time limit plus VISIBILITY_MARGIN_S (`visibility_timeout_s`).
VISIBILITY_TIMEOUT_S = 900
VISIBILITY_MARGIN_S = 60

app = Celery("trainfleet", include=TASK_MODULES, set_as_current=True)


def celery_url(redis_url: str) -> str:
    """The broker URL kombu understands for a Redis URL of redis-py's: a unix socket (`unix://[:pw@]/path
    ?db=N`, the embedded Redis) is `redis+socket://[:pw@]/path[?virtual_host=N]` to kombu (and Flower);
    redis:// and rediss:// are the same to both."""
    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    db = parse_qs(parts.query).get("db", ["0"])[0]
    query = "" if db == "0" else f"?virtual_host={db}"
    return f"redis+socket://{parts.netloc}{parts.path}{query}"


def configure(settings: Settings, redis_url: str) -> Celery:
    """Point the app at Redis and set its delivery rules (idempotent)."""
    sentinel = urlsplit(redis_url).scheme == redisurl.SENTINEL_SCHEME
    redis_url, master = redisurl.kombu_url(redis_url) if sentinel else (celery_url(redis_url), {})
    if app.conf.broker_url not in (None, redis_url):
        # Another Redis than before (a process that connects to a second fleet: tests do). The app keeps
        # the pools it made for the first one and would go on sending there: drop them (not close them:
        # kombu keeps them per URL, for a return to that Redis).
        app._pool = None
        app.amqp._producer_pool = None
    limits = time_limits(settings)
    transport = {"visibility_timeout": visibility_timeout_s(settings), **master}
    app.conf.update(
        broker_url=redis_url,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
        task_default_queue=Stage.PROVISION.value,
        task_queues=[Queue(q, Exchange(q, type="direct"), routing_key=q) for q in QUEUES],
        task_routes={
            **{s.task_name: {"queue": s.value} for s in Stage},
            REAP_TASK: {"queue": REAP_QUEUE},
            REAP_AT_TASK: {"queue": REAP_QUEUE},
        },
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        beat_schedule={
            "reap": {"task": REAP_TASK, "schedule": timedelta(seconds=settings.reap_interval_s)},
        },
        timezone="UTC",
        task_annotations={name: {"soft_time_limit": s, "time_limit": h} for name, (s, h) in limits.items()},
    )
    _apply_time_limits(limits)
    return app


def time_limits(settings: Settings) -> dict[str, tuple[float, float]]:
    """Every task's (soft, hard) time limit in seconds, by task name. At the soft one the task's step gets
    SoftTimeLimitExceeded (the runner retries the step, within its bound); `time_limit_grace_s` later the
    worker kills the process (the reaper re-sends the task; a task that keeps dying fails the run STALLED)."""
    soft: dict[str, float] = {
        **{stage.task_name: getattr(settings, facts.time_limit) for stage, facts in STAGES.items()},
        REAP_TASK: settings.reap_time_limit_s,
        REAP_AT_TASK: settings.reap_time_limit_s,
    }
    return {name: (limit, limit + settings.time_limit_grace_s) for name, limit in soft.items()}


def visibility_timeout_s(settings: Settings) -> float:
    """How long a taken message stays unacked before Redis hands it out again: past every hard limit."""
    longest = max(hard for _soft, hard in time_limits(settings).values())
    return max(float(VISIBILITY_TIMEOUT_S), longest + VISIBILITY_MARGIN_S)


def _apply_time_limits(limits: dict[str, tuple[float, float]]) -> None:
    """The limits on the tasks: Celery reads `task_annotations` once, as it makes a task (and caches the
    parsed form), so a task made before this call (a process configured twice: tests) gets them here."""
    app.__dict__.pop("annotations", None)  # Celery's cached_property: parsed again from the new conf
    if not app.finalized:
        return  # the tasks are made later, from the annotations above
    for name, (soft, hard) in limits.items():
        if name in app.tasks:
            task = app.tasks[name]
            task.soft_time_limit, task.time_limit = soft, hard
