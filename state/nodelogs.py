"""The output of a run's Ray jobs on its node (the trainer's stdout and stderr, each stage's job), kept in
Redis: `fleet logs RUN --node` reads it from any machine that reaches the fleet's Redis, while the run goes
and after its node is gone. Whoever keeps a text has redacted it (workers.node_job.keep_log); each job keeps
its last KEEP_CHARS characters, for KEEP_S after its last write."""

from __future__ import annotations

import time

import redis

from state.keys import node_log_key, node_logs_key

KEEP_CHARS = 256 * 1024
KEEP_S = 14 * 24 * 3600


def append(client: redis.Redis[str], run_id: str, submission_id: str, text: str) -> None:
    """Add `text` (new whole lines of a running job's output) to what is kept of its job."""
    if not text:
        return
    key = node_log_key(run_id, submission_id)
    pipe = client.pipeline(transaction=False)
    _index(pipe, run_id, submission_id)
    pipe.append(key, text)
    pipe.expire(key, KEEP_S)
    size = pipe.execute()[-2]
    if size > 2 * KEEP_CHARS:  # bytes; trimmed now and then, not at every append (one writer per run)
        client.set(key, (client.get(key) or "")[-KEEP_CHARS:], ex=KEEP_S)


def put(client: redis.Redis[str], run_id: str, submission_id: str, text: str) -> None:
    """Keep the whole output of an ended job (its end, when it is long)."""
    pipe = client.pipeline(transaction=False)
    _index(pipe, run_id, submission_id)
    pipe.set(node_log_key(run_id, submission_id), text[-KEEP_CHARS:], ex=KEEP_S)
    pipe.execute()


def _index(pipe: redis.client.Pipeline[str], run_id: str, submission_id: str) -> None:
    pipe.zadd(node_logs_key(run_id), {submission_id: time.time()}, nx=True)
    pipe.expire(node_logs_key(run_id), KEEP_S)


def read(client: redis.Redis[str], run_id: str) -> list[tuple[str, str]]:
    """Each kept job of the run, in the order its output was first kept: (submission id, output)."""
    jobs = client.zrange(node_logs_key(run_id), 0, -1)
    texts = client.mget([node_log_key(run_id, sid) for sid in jobs]) if jobs else []
    return [(sid, text or "") for sid, text in zip(jobs, texts, strict=True)]


def heading(submission_id: str) -> str:
    """The line over a job's output where several are shown in one text (as `tail` heads its files)."""
    return f"==> {submission_id} <==\n"
