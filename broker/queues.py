"""The Celery queues and task names: a queue per stage (state.stages.Stage names both), and the reaper's."""

from __future__ import annotations

from state.stages import Stage

REAP_QUEUE = "reap"
REAP_TASK = "trainfleet.reap"
REAP_AT_TASK = "trainfleet.reap_at"  # a pass at a deadline (an idle node's stop_after), on the reap queue
QUEUES: tuple[str, ...] = (*(s.value for s in Stage), REAP_QUEUE)
