"""The job's `entry` script (a rented machine's section key) as a checked setup step of the prepare stage.

It runs on the node as a Ray job of its own, before the fetch: `sh -c SCRIPT entry`, the script quoted
whole as sh's one argument (shlex.quote), in the run's working directory on the node (the directory the
run's other Ray jobs get), with the section's `env` and what every Ray job of the run gets
(workers.node_job.node_env). Not in an environment variable: Ray expands `$NAME` in a job's env_vars
before the job starts (ray._private.utils.update_envs), which would change the script.

Its submission is idempotent across worker crashes and retries (one id per attempt, in `run.ray_jobs`);
its end is recorded once (`run.progress.entry_ended`) as a prepare.entry event with its status, exit code,
seconds and the tail of its output, the fleet's credentials taken out. A non-zero exit ends the run with
ENTRY_FAILED (a StageFailed: not retried; its node terminated, or kept per one_shot, as on any failure).
"""

from __future__ import annotations

import shlex

from core.errors import FailureReason, StageFailed
from jobs.redact import redact_values
from jobs.sections.base import MachineSection
from providers.node import JobInfo, JobStatus, NodeClient
from state.ledger import Draft
from state.models import Run
from state.payloads import PrepareEntry, RaySubmitted
from workers import context
from workers.node_job import files_for_node, job_log, known_secrets, node_env, submit_once

RAY_JOBS_KEY = "prepare.entry"  # the entry job's key in run.ray_jobs
OUTPUT_TAIL = 3000  # characters of its output that its event keeps
MESSAGE_TAIL = 1500  # ... and that the failure message of the run keeps


def script_of(run: Run) -> str | None:
    """The run's `entry` script, or None (none given, or a provider section without the key)."""
    section = run.spec.section
    return section.entry if isinstance(section, MachineSection) else None


def submission_id(run: Run) -> str:
    return f"{run.run_id}-{run.attempt}-entry"


def entrypoint(script: str) -> str:
    """The command line that runs `script` with sh (`entry` is its $0, naming it in the shell's errors)."""
    return f"sh -c {shlex.quote(script)} entry"


def output_of(ctx: context.Context, run: Run, client: NodeClient, sid: str, script: str) -> str:
    """The job's log (kept for `fleet logs --node`), less the line in which Ray repeats its command line."""
    log = job_log(ctx, run, client, sid)
    return log.replace(f"Running entrypoint for job {sid}: {entrypoint(script)}\n", "", 1)


def succeeded(ctx: context.Context, run: Run, client: NodeClient, script: str) -> bool:
    """Whether the entry script has run to a zero exit on the node: submits it when it is not there, False
    while it runs. Its end is recorded once; an end other than success raises StageFailed(ENTRY_FAILED)."""
    sid = submission_id(run)

    def submit() -> None:
        env = {**run.spec.section.env, **node_env(ctx, run)}
        client.submit(sid, entrypoint(script), env, files_for_node(ctx, run))

    info = submit_once(ctx, run, client, RAY_JOBS_KEY, sid, submit, [RaySubmitted(ray_job=sid)])
    if info is None or not info.status.is_terminal():
        return False
    output = redact_values(output_of(ctx, run, client, sid, script), known_secrets(ctx))[-OUTPUT_TAIL:]
    ended = PrepareEntry(
        ray_job=sid,
        status=info.status.value,
        exit_code=info.exit_code,
        seconds=info.seconds,
        output=output,
    )

    def record(r: Run) -> list[Draft]:
        if r.progress.entry_ended == sid:
            return []
        r.progress.entry_ended = sid
        return [ended]

    ctx.ledger.update_run(run.run_id, record)
    if info.status == JobStatus.SUCCEEDED:
        return True
    raise StageFailed(FailureReason.ENTRY_FAILED, failure_message(info, output))


def failure_message(info: JobInfo, output: str) -> str:
    """Why the run failed: how the script ended, then the end of its output (last, so that the shortest
    cut of the message, the run.failed event's, still shows the script's last words)."""
    if info.exit_code is not None:
        how = f"the entry script exited with code {info.exit_code}"
    else:  # it never ran to an exit: stopped, or its Ray job could not start
        first = info.message.strip().splitlines()[0][:300] if info.message.strip() else ""
        how = f"the entry job ended {info.status.value}" + (f" ({first})" if first else "")
    tail = output[-MESSAGE_TAIL:].rstrip("\n")
    return f"{how}; the end of its output:\n{tail}" if tail else f"{how}, printing nothing"
