"""The git trigger: enqueue the job configs that new commits add or modify, exactly once per (commit, path).

`look` follows a branch: the commits after the branch's watermark (the last commit looked at completely,
kept in Redis per repository and branch), oldest first along first parents (a merge counts as one commit:
what it brought onto the branch), and in each the configs matching the globs that the commit added,
modified or renamed, read as of that commit. `enqueue_changed` does the same once for `REF..HEAD` (CI).
The files a config names come from that commit's tracked files only, never from the working tree
(service.gitsnapshot: one snapshot per commit and look, removed once the commit's configs are settled).

Exactly once, also with several watchers and across a crash. Each (commit, path) has a claim key set once
(SET NX) to the run id chosen for it, and that run is submitted only under the run id's lease (SET NX with
a TTL) after checking that the run does not exist yet. So:
- two watchers claim the same config: one claim wins; the other sees the lease held (IN_FLIGHT), or the run;
- a process dies between claiming and submitting: the claim names a run that does not exist; a later look
  submits it under that same run id (at once, or once the dead process's lease has expired);
- a run id is leased before it is claimed, and only if no run has it: two configs never share one.
A config invalid at its commit is reported once and its claim marked GIT_INVALID (its content there never
changes). A valid config the fleet refuses now (a missing credential, the budget cap) stays claimed without
a run: it is retried at every look, and the watermark stays before its commit until it is enqueued.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

import redis

from core.errors import ConfigError, FleetError, GitError, OverBudget, Problem
from jobs.paths import Confinement
from jobs.spec import LoadedJob, format_problems, parse_job
from jobs.yamlsafe import MAX_BYTES
from service import runs
from service.gitrepo import ZERO_SHA, GitRepo
from service.gitsnapshot import Snapshot, TreeRefused
from state.keys import GIT_INVALID, git_claim_key, git_lease_key, git_watermark_key, run_key
from state.payloads import GitOrigin

DEFAULT_GLOB = "tasks/**/*.yml"
LEASE_S = 120  # how long a submit may take before another process may take the claimed run over
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class Outcome(StrEnum):
    """What happened to one (commit, path)."""

    ENQUEUED = "enqueued"  # its run was created now
    ALREADY = "already"  # its run was created before (by this process or another)
    INVALID = "invalid"  # invalid at that commit: reported now, marked seen, never enqueued
    SEEN_INVALID = "seen_invalid"  # invalid, reported by an earlier look
    REFUSED = "refused"  # valid, but the fleet refuses it now (credential, budget): retried next look
    IN_FLIGHT = "in_flight"  # another process holds its lease (submitting it now, or died doing so)

    @property
    def pending(self) -> bool:
        """Not settled yet: the watermark stays before its commit, so the next look tries it again."""
        return self in (Outcome.REFUSED, Outcome.IN_FLIGHT)


class Start(StrEnum):
    """How a look began when it did not walk from the watermark."""

    FIRST = "first"  # no watermark yet: watching from the branch's head, nothing enqueued
    REWRITTEN = "rewritten"  # the watermark is not an ancestor of the head (force-push): skipped


@dataclass(frozen=True)
class ConfigResult:
    commit: str
    path: str
    outcome: Outcome
    run_id: str | None = None
    message: str = ""  # the problems (INVALID) or the refusal (REFUSED), for people
    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.path}@{self.commit[:7]}"

    def view(self) -> dict[str, Any]:
        problems = [{"path": p.path, "line": p.line, "message": p.message} for p in self.problems]
        return {"event": self.outcome.value, "commit": self.commit, "path": self.path, "run_id": self.run_id,
                "source": self.where, "message": self.message or None, "problems": problems}  # fmt: skip


@dataclass
class Look:
    """One look at a branch (or at REF..HEAD): where it went and what each config became."""

    head: str
    start: str | None
    commits: list[str] = field(default_factory=list)
    results: list[ConfigResult] = field(default_factory=list)
    began: Start | None = None

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome == outcome)

    def view(self) -> dict[str, Any]:
        counts = {o.value: self.count(o) for o in Outcome}
        return {"event": "look", "head": self.head, "from": self.start, "commits": len(self.commits),
                "began": self.began.value if self.began else None, **counts}  # fmt: skip


@dataclass(frozen=True)
class Trigger:
    """What every look needs: the fleet, the repository (and its id in keys and origins), the globs."""

    fleet: runs.Fleet
    repo: GitRepo
    repo_id: str
    globs: list[str]
    overrides: Mapping[str, Any] | None = None


def branch_head(repo: GitRepo, branch: str, remote: str | None = None) -> str:
    """The commit at the tip of `branch` (local, or `remote`'s remote-tracking one); GitError if none."""
    ref = f"refs/remotes/{remote}/{branch}" if remote else f"refs/heads/{branch}"
    head = repo.commit(ref)
    if head is None:
        where = f"{remote}/{branch} (after fetching {remote})" if remote else f"branch {branch!r}"
        raise GitError(f"{repo.root} has no {where}")
    return head


def look(
    trigger: Trigger,
    branch: str,
    head: str,
    since: str | None = None,
    stop: threading.Event | None = None,
) -> Look:
    """Enqueue the matching configs of the commits of `branch` after its watermark (or after `since`) up
    to `head`, and move the watermark along. Stops between commits once `stop` is set."""
    client, repo = trigger.fleet.redis, trigger.repo
    key = git_watermark_key(trigger.repo_id, branch)
    if since is not None:
        start = repo.commit(since)
        if start is None or not repo.is_ancestor(start, head):
            raise GitError(f"--since {since}: no such commit on {branch} in {repo.root}")
    else:
        start = client.get(key)
        if start is None:
            client.set(key, head, nx=True)
            return Look(head, None, began=Start.FIRST)
        if not repo.is_ancestor(start, head):  # rewritten (or never fetched here): enqueue none of it
            client.set(key, head)
            return Look(head, start, began=Start.REWRITTEN)
    result = Look(head, start, repo.first_parent_commits(start, head))
    settled = True
    for commit in result.commits:
        if stop is not None and stop.is_set():
            break
        origin = GitOrigin(repo=trigger.repo_id, branch=branch, commit=commit)
        paths = repo.changed_files(repo.first_parent(commit), commit, trigger.globs)
        with Snapshot(repo, commit, trigger.fleet.settings.home) as tree:
            done = _enqueue_all(trigger, commit, paths, origin, tree)
        result.results += done
        settled = settled and not any(r.outcome.pending for r in done)
        if settled:
            _advance(trigger, key, commit)
    return result


def enqueue_changed(trigger: Trigger, ref: str) -> Look:
    """Enqueue the matching configs that differ between `ref` and HEAD (added, modified or renamed), read
    as of HEAD, each once per (HEAD, path). GitError for an all-zero or unknown `ref`."""
    repo = trigger.repo
    if ZERO_SHA.fullmatch(ref):
        raise GitError(
            f"--changed-since {ref}: all zeros (a push that created the branch has no 'before' commit); "
            "give a base such as origin/main or HEAD~1"
        )
    head = repo.commit("HEAD")
    if head is None:
        raise GitError(f"{repo.root} has no commit yet")
    base = repo.commit(ref)
    if base is None:
        raise GitError(
            f"--changed-since {ref}: no such commit in {repo.root} (a shallow clone? check out with "
            "fetch-depth: 0; after a force-push the old commit may be gone)"
        )
    origin = GitOrigin(repo=trigger.repo_id, branch=repo.branch(), commit=head, since=base)
    result = Look(head, base, [head] if base != head else [])
    with Snapshot(repo, head, trigger.fleet.settings.home) as tree:
        paths = repo.changed_files(base, head, trigger.globs) if base != head else []
        result.results += _enqueue_all(trigger, head, paths, origin, tree)
    return result


def _advance(trigger: Trigger, key: str, commit: str) -> None:
    """Set the watermark to `commit` unless it already is at `commit` or past it (another watcher)."""
    with trigger.fleet.redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                current = cast(str | None, pipe.get(key))  # immediate while watching
                if current is not None and trigger.repo.is_ancestor(commit, current):
                    return
                pipe.multi()
                pipe.set(key, commit)
                pipe.execute()
                return
            except redis.WatchError:
                continue


def _enqueue_all(
    trigger: Trigger, commit: str, paths: list[str], origin: GitOrigin, tree: Snapshot
) -> list[ConfigResult]:
    """Settle a commit's configs. Those not enqueued yet are checked against the caps together first
    (service.runs.check_budget): over one, each is REFUSED (claimed, retried at the next look), none
    queued."""
    client = trigger.fleet.redis
    fresh: dict[str, LoadedJob] = {}
    for path in paths:
        run_id = client.get(git_claim_key(trigger.repo_id, commit, path))
        if run_id is None or (run_id != GIT_INVALID and not client.exists(run_key(run_id))):
            with contextlib.suppress(ConfigError):  # an invalid one is reported as it is settled
                fresh[path] = _load(trigger, commit, path, tree)
    refused = None
    try:
        if fresh:
            runs.check_budget(trigger.fleet, list(fresh.values()), origin)
    except OverBudget as exc:
        refused = str(exc)
    return [_enqueue(trigger, commit, path, origin, tree, refused, fresh.get(path)) for path in paths]


def _enqueue(
    trigger: Trigger,
    commit: str,
    path: str,
    origin: GitOrigin,
    tree: Snapshot,
    refused: str | None = None,
    loaded: LoadedJob | None = None,
    again: bool = True,
) -> ConfigResult:
    """Settle one (commit, path): see the module's docstring for the protocol. `tree` is the commit's;
    `refused`: why the commit's configs together may not be queued now (a valid one is then REFUSED);
    `loaded`: the config, when it was read for that already."""
    client = trigger.fleet.redis
    claim = git_claim_key(trigger.repo_id, commit, path)
    run_id = client.get(claim)
    if run_id == GIT_INVALID:
        return ConfigResult(commit, path, Outcome.SEEN_INVALID)
    if run_id is not None and client.exists(run_key(run_id)):
        return ConfigResult(commit, path, Outcome.ALREADY, run_id)
    token = secrets.token_hex(8)
    if run_id is None:
        run_id = _lease_new_id(client, token)
        if not client.set(claim, run_id, nx=True):  # another process claimed it first: take its path
            _release(client, run_id, token)
            if again:
                return _enqueue(trigger, commit, path, origin, tree, refused, loaded, again=False)
            raise FleetError(f"the claim on {path}@{commit[:7]} changed twice while looking at it")
    elif not client.set(git_lease_key(run_id), token, nx=True, ex=LEASE_S):
        return ConfigResult(commit, path, Outcome.IN_FLIGHT, run_id)
    try:
        if client.exists(run_key(run_id)):
            return ConfigResult(commit, path, Outcome.ALREADY, run_id)
        origin = origin.model_copy(update={"path": path})
        return _submit(trigger, commit, path, run_id, origin, tree, refused, loaded)
    finally:
        _release(client, run_id, token)


def _lease_new_id(client: redis.Redis[str], token: str) -> str:
    """A fresh run id that no run has, leased to `token` (so no other config can claim it meanwhile)."""
    for _ in range(100):
        run_id = runs.new_run_id()
        if client.set(git_lease_key(run_id), token, nx=True, ex=LEASE_S):
            if not client.exists(run_key(run_id)):
                return run_id
            _release(client, run_id, token)
    raise FleetError("could not find a free run id in 100 tries")


def _release(client: redis.Redis[str], run_id: str, token: str) -> None:
    client.register_script(_RELEASE)(keys=[git_lease_key(run_id)], args=[token])


def _submit(
    trigger: Trigger,
    commit: str,
    path: str,
    run_id: str,
    origin: GitOrigin,
    tree: Snapshot,
    refused: str | None = None,
    loaded: LoadedJob | None = None,
) -> ConfigResult:
    """Under the lease of `run_id`, with no run of that id yet: validate the config as of `commit` (unless
    `loaded` is it, read already) and submit it, or mark it invalid, or report the fleet's refusal (the
    claim stays for the next look)."""
    fleet = trigger.fleet
    claim = git_claim_key(trigger.repo_id, commit, path)
    try:
        job = loaded or _load(trigger, commit, path, tree)
    except ConfigError as exc:
        fleet.redis.set(claim, GIT_INVALID)
        return ConfigResult(commit, path, Outcome.INVALID, None, format_problems(exc), tuple(exc.problems))
    if refused is not None:
        return ConfigResult(commit, path, Outcome.REFUSED, run_id, f"{job.source}: {refused}")
    try:
        runs.check_submittable(fleet.world, job, origin)
        runs.check_budget(fleet, [job], origin)
    except ConfigError as exc:
        return ConfigResult(commit, path, Outcome.REFUSED, run_id, format_problems(exc), tuple(exc.problems))
    except OverBudget as exc:
        return ConfigResult(commit, path, Outcome.REFUSED, run_id, f"{job.source}: {exc}")
    try:
        runs.submit(fleet, job, run_id=run_id, origin=origin)
    except OverBudget as exc:  # the cap was reached since the check just above
        return ConfigResult(commit, path, Outcome.REFUSED, run_id, f"{job.source}: {exc}")
    except ConfigError as exc:  # what only submit finds (datasets a rented node cannot get): permanent
        fleet.redis.set(claim, GIT_INVALID)
        exc = tree.shown(exc, job.lines)
        return ConfigResult(commit, path, Outcome.INVALID, None, format_problems(exc), tuple(exc.problems))
    return ConfigResult(commit, path, Outcome.ENQUEUED, run_id, warnings=tuple(job.warnings))


def _load(trigger: Trigger, commit: str, path: str, tree: Snapshot) -> LoadedJob:
    """The config as of `commit`. Its local files are the commit's tracked files (`tree`) or under the
    operator's data roots, relative paths looked up from the file's directory in the commit; ConfigError
    (named path@short-sha) if invalid, also for a commit whose files are not written out (TreeRefused)."""
    repo, source = trigger.repo, f"{path}@{commit[:7]}"
    size = repo.size(commit, path)
    if size > MAX_BYTES:
        raise ConfigError(source, [Problem("", f"file is {size} bytes; the limit is {MAX_BYTES} bytes")])
    data = repo.read(commit, path)
    try:
        root = tree.root()
    except TreeRefused as exc:
        raise ConfigError(source, [Problem("", str(exc))]) from None
    try:
        job = parse_job(
            data,
            source=source,
            base_dir=(root / path).parent,
            default_provider=trigger.fleet.settings.default_provider,
            overrides=trigger.overrides,
            paths=Confinement(root, trigger.fleet.settings.data_roots),  # the commit: the job's directory
        )
    except ConfigError as exc:
        raise tree.shown(exc) from None
    if job.sweep is not None:  # never "refused, retried": the file will not change at that commit
        message = "the git trigger starts single runs; start a sweep with `fleet sweep FILE`"
        raise ConfigError(source, [Problem("sweep", message, job.lines.get("sweep"))])
    return job
