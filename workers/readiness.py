"""The node's readiness check, the last step of provision: a node counts as ready only once a Ray job on
its head, run by the interpreter that will train, has found that it can train (trainer.nodecheck): Python
and Ray as the fleet's, torch, transformers and peft importable, and the GPUs its section asks for. A node
that fails it is terminated at once (even one a job would keep for debugging) and the run fails
NODE_BROKEN with what is missing, before any training. What the node's start script installed because its
image lacked it comes back with the check, as the `node.setup` event.

A check that passed is remembered (REMEMBER_S) for nodes whose provider can tell their software without
them (Provider.software_key: a local head's interpreter, packages and environment): the next such node
with the same key and the same check is ready without one (`node.ready` says `remembered`). A rented node
is checked every time."""

from __future__ import annotations

import hashlib
import importlib.metadata
import shlex
import sys

from core.errors import FailureReason, StageFailed
from providers.base import NodeEndpoint, NodeSoftware
from providers.node import JobStatus, NodeClient, NodeTimeouts
from providers.onnode.nodesetup import split_source
from state.keys import node_check_key
from state.ledger import Draft
from state.models import Run
from state.payloads import EventType, NodeCheck, NodeReady, NodeSetup
from state.stages import Stage
from trainer import progress
from workers import context
from workers.node_job import job_log, node_record, node_software, submit_once
from workers.stage import Next, enter_next

CHECK_JOB = "check"  # the check's key in run.ray_jobs
REMEMBER_S = 24 * 3600  # how long a passed check holds for later nodes with the same software
FLEET_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def entrypoint(gpus: int, software: NodeSoftware | None = None) -> str:
    """The check's command line: what the run's section asks of each node, and the fleet's versions. An
    axolotl node keeps its image's Python and must have axolotl at the run's release."""
    ray = importlib.metadata.version("ray")
    argv = ["python", "-m", "trainer", "check", f"--gpus={gpus}", f"--ray={ray}"]
    if software is not None and software.trainer == "axolotl":  # a fork: any version (its source is checked)
        return shlex.join([*argv, f"--axolotl={software.axolotl_version or 'any'}"])
    return shlex.join([*argv, f"--python={FLEET_PYTHON}"])


def check_node(ctx: context.Context, run: Run, head: str, endpoint: NodeEndpoint, ready: Draft) -> Next:
    """Run the readiness check on the head (once per attempt; `ready`, the instance.ready event, goes out
    when it is submitted), and go on to prepare once it passes."""
    client = NodeClient(endpoint, NodeTimeouts.of(ctx.settings))
    sid = f"{run.run_id}-{run.attempt}-{CHECK_JOB}"
    command = entrypoint(run.spec.head_gpu_count, node_software(ctx, run))  # checked on the head
    memory = _memory(ctx, run, head, command)
    if memory is not None and run.ray_jobs.get(CHECK_JOB) != sid and (known := ctx.redis.get(memory)):
        return _ready(ctx, run, head, NodeCheck.model_validate_json(known), [ready], remembered=True)
    info = submit_once(ctx, run, client, CHECK_JOB, sid, lambda: client.submit(sid, command, {}), [ready])
    if info is None:
        return Next.poll(Stage.PROVISION, ctx.settings.poll_interval_s)
    if not info.status.is_terminal():
        return Next.wait_job(ctx, Stage.PROVISION, sid)
    logs = job_log(ctx, run, client, sid)
    found = [r for r in progress.parse(logs) if r["kind"] == progress.Kind.CHECKED]
    if info.status != JobStatus.SUCCEEDED or not found:
        why = f"its readiness check {info.status}: {info.message}".rstrip(": ")
        raise _broken(head, f"{why}\n{logs[-1500:]}")
    record = found[-1]
    problems = [str(p) for p in record.get("problems") or []] + _fork_problems(ctx, run, record)
    setup = record.get("setup")
    said = node_record(EventType.NODE_SETUP, setup) if isinstance(setup, dict) else None
    if problems:
        if isinstance(said, NodeSetup):
            ctx.ledger.update_run(run.run_id, lambda r: [said])
            if said.error:
                problems.append(f"the node's setup could not install what it lacks: {said.error}")
        raise _broken(head, "; ".join(problems))
    check = NodeCheck.model_validate(
        {k: v for k, v in record.items() if k not in ("kind", "problems", "setup", "missing")}
    )
    if memory is not None:
        ctx.redis.set(memory, check.model_dump_json(), ex=REMEMBER_S)
    return _ready(ctx, run, head, check, [said] if isinstance(said, NodeSetup) else [])


def _fork_problems(ctx: context.Context, run: Run, record: dict[str, object]) -> list[str]:
    """What is wrong with the node's axolotl when the section names a fork: not installed from it (its
    URL, and the branch or the run's pinned commit)."""
    wanted = node_software(ctx, run).axolotl_source
    if wanted is None:
        return []
    url, ref = split_source(wanted)
    got = record.get("axolotl_source")
    got = got if isinstance(got, dict) else {}
    if got.get("url") != url or (ref is not None and ref not in (got.get("ref"), got.get("commit"))):
        said = f"{got.get('url')} at {got.get('commit')}" if got else "not from git"
        return [f"axolotl on the node is {said}, the job asks for the fork {wanted}"]
    return []


def _ready(
    ctx: context.Context, run: Run, head: str, check: NodeCheck, drafts: list[Draft], remembered: bool = False
) -> Next:
    """The node passed (or, `remembered`, one with its software did): on to prepare. The first node of a
    run that installs a fork of axolotl pins the commit it got, for every later node."""
    ctx.ledger.update_instance(head, check=check)
    commit = (check.axolotl_source or {}).get("commit")

    def go(r: Run) -> list[Draft]:
        if commit and r.spec.section.axolotl_fork() is not None and r.progress.axolotl_commit is None:
            r.progress.axolotl_commit = commit
        ready = NodeReady(instance=head, check=check, remembered=remembered)
        return [*drafts, ready, *enter_next(r, Stage.PROVISION)]

    ctx.ledger.update_run(run.run_id, go)
    return Next.onward(Stage.PROVISION)


def _memory(ctx: context.Context, run: Run, head: str, command: str) -> str | None:
    """Where a passed check of `command` is kept for the head's software; None when the provider cannot
    tell its software without the node (every rented one)."""
    key = ctx.provider(run.provider).software_key(head)
    if not key:
        return None
    return node_check_key(hashlib.sha256(f"{key}\0{command}".encode()).hexdigest())


def _broken(head: str, why: str) -> StageFailed:
    """The run fails NODE_BROKEN, and its nodes go even if the job would keep them: they cannot train."""
    return StageFailed(FailureReason.NODE_BROKEN, f"instance {head} cannot train: {why}", keep=False)
