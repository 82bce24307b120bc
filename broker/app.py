"""The Celery app: queues per stage, late acks, prefetch 1, and the reaper on beat.

The app object exists at import (Celery needs one to register tasks) but holds no configuration until
`configure(settings)` is called once per process by whoever starts it (the CLI, a worker, a test).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from celery import Celery
from kombu import Exchange, Queue

from broker.constants import QUEUES, REAP_QUEUE, REAP_TASK, Stage

if TYPE_CHECKING:
    from core.settings import Settings

TASK_MODULES = ["workers.provision", "workers.prepare", "workers.train", "workers.finalize", "workers.reap"]
# Long enough that no task (each is a short step) is redelivered while still running; a worker that
# died leaves its message to the reaper's kick long before this.
VISIBILITY_TIMEOUT_S = 900

app = Celery("trainfleet", include=TASK_MODULES, set_as_current=True)


def configure(settings: Settings, redis_url: str) -> Celery:
    """Point the app at Redis and set its delivery rules (idempotent)."""
    if app.conf.broker_url not in (None, redis_url):
        # Another Redis than before (a process that connects to a second fleet: tests do). The app keeps
        # the pools it made for the first one and would go on sending there: drop them (not close them:
        # kombu keeps them per URL, for a return to that Redis).
        app._pool = None
        app.amqp._producer_pool = None
    transport = {"visibility_timeout": VISIBILITY_TIMEOUT_S}
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
        task_routes={**{s.task_name: {"queue": s.value} for s in Stage}, REAP_TASK: {"queue": REAP_QUEUE}},
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        beat_schedule={
            "reap": {"task": REAP_TASK, "schedule": timedelta(seconds=settings.reap_interval_s)},
        },
        timezone="UTC",
    )
    return app
