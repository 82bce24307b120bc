"""The Celery app and its routing, Redis key and queue names, the ledger and the event stream."""
