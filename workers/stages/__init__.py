"""The stage tasks, one module each (provision, prepare, train, finalize and the periodic reap): a thin
Celery task over a plain `step(ctx, run) -> Next`. What they share lives one level up, in workers/."""
