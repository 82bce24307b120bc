"""The queue: the Celery app and its routing (a queue per stage), who may act on a run next (dispatch, its
leases and the parked runs), and a sweep's slots. The state it moves is state/'s."""
