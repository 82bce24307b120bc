"""One module per stage (provision, prepare, train, finalize, reap): thin Celery tasks over plain steps."""
