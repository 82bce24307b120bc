"""`fleet watch` and `fleet enqueue --changed-since`: the git-commit trigger (logic in fleet/gitwatch.py)."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Annotated, Any, NoReturn

import redis
import typer

from core.errors import GitError
from fleet.cli_common import JsonOpt, connect_or_exit, err, out, world_or_exit
from service import gitwatch
from service.gitrepo import GitRepo
from service.gitwatch import DEFAULT_GLOB, ConfigResult, Look, Outcome, Start, Trigger
from state.payloads import DiscordOrigin, GitOrigin

REMOTE = "origin"
GlobOpt = Annotated[
    list[str],
    typer.Option("--glob", help="Which files are job configs (repeatable); '**' spans directories."),
]


def register(cli: typer.Typer) -> None:
    """Add these commands to the `fleet` app."""
    cli.command()(watch)


def watch(
    repo: Annotated[Path, typer.Argument(help="A git repository's working tree.")] = Path("."),
    branch: Annotated[str, typer.Option(help="The branch to follow.")] = "main",
    glob: GlobOpt = [DEFAULT_GLOB],  # noqa: B006 - typer copies it
    once: Annotated[
        bool, typer.Option(help="Look once and exit (1 if a config was invalid or refused).")
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between looks.")] = 30.0,
    fetch: Annotated[
        bool, typer.Option(help=f"`git fetch {REMOTE}` before each look and follow {REMOTE}/BRANCH.")
    ] = False,
    since: Annotated[
        str | None, typer.Option(help="Start after this commit (else after the last one seen).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Follow a branch and enqueue the configs that new commits add or modify, once per (commit, path).

    The first look (no commit seen yet for this repository and branch) enqueues nothing: it starts from
    the branch's head, unless --since is given. A rewritten branch (force-push) is not replayed: the
    watcher warns and goes on from the new head. Ctrl-C or SIGTERM stops it after the current commit.
    """
    world = world_or_exit()
    try:
        git = GitRepo.open(repo)
        if fetch:
            git.fetch(REMOTE)
        gitwatch.branch_head(git, branch, REMOTE if fetch else None)
    except GitError as exc:
        _fail(exc)
    trigger = Trigger(connect_or_exit(world), git, git.repo_id(REMOTE), glob)
    stop = threading.Event()
    previous = _stop_on_signals(stop)
    try:
        failed = _follow(trigger, branch, once, interval, fetch, since, as_json, stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    raise typer.Exit(1 if once and failed else 0)


def _follow(
    trigger: Trigger,
    branch: str,
    once: bool,
    interval: float,
    fetch: bool,
    since: str | None,
    as_json: bool,
    stop: threading.Event,
) -> bool:
    """Look until stopped (or once); True if a config was invalid or refused."""
    shown: set[tuple[str, str]] = set()  # refusals already printed: once each, not at every look
    failed, first = False, True
    while True:
        try:
            if fetch and not first:
                trigger.repo.fetch(REMOTE)
            head = gitwatch.branch_head(trigger.repo, branch, REMOTE if fetch else None)
            result = gitwatch.look(trigger, branch, head, since if first else None, stop)
        except (GitError, redis.RedisError) as exc:
            if once or first:
                _fail(exc)
            err.print(f"error: {exc} (trying again in {interval:g} s)", style="red", markup=False)
        else:
            failed |= _report(result, as_json, shown, label=f"{branch} of {trigger.repo_id}")
        first = False
        if once or stop.wait(interval):
            return failed


def enqueue_changed(repo: Path, ref: str, globs: list[str], use_ray: bool, as_json: bool) -> NoReturn:
    """`fleet enqueue --changed-since REF`: the configs changed in REF..HEAD, read as of HEAD, each once
    per (HEAD, path). Unlike plain `enqueue`, not all-or-nothing: an invalid config is reported (exit 1)
    and the valid ones are queued, as the watcher does."""
    world = world_or_exit()
    try:
        git = GitRepo.open(repo)
        trigger = Trigger(connect_or_exit(world), git, git.repo_id(REMOTE), globs,
                          {"use_ray": True} if use_ray else None)  # fmt: skip
        result = gitwatch.enqueue_changed(trigger, ref)
    except GitError as exc:
        _fail(exc)
    failed = False
    for r in result.results:
        failed |= _report_config(r, as_json=False, shown=set(), quiet=True)
    if as_json:
        out.print_json(json.dumps([r.view() for r in result.results]))
    else:
        for r in result.results:
            if r.outcome == Outcome.ENQUEUED:
                print(r.run_id)
    if not result.results:
        err.print(f"no config matching {', '.join(globs)} changed in {ref}..HEAD", highlight=False)
    raise typer.Exit(1 if failed else 0)


def origin_text(origin: GitOrigin | DiscordOrigin) -> str:
    """A run's origin in one line for `fleet status RUN`."""
    if isinstance(origin, DiscordOrigin):
        return f"Discord user {origin.user_id}"
    branch = f", branch {origin.branch}" if origin.branch else ""
    return f"{origin.path} at commit {origin.commit} ({origin.repo}{branch})"


def _report(look: Look, as_json: bool, shown: set[tuple[str, str]], label: str) -> bool:
    """Print one look; True if a config was invalid or refused."""
    failed = False
    for r in look.results:
        failed |= _report_config(r, as_json, shown)
    if as_json:
        print(json.dumps(look.view()), flush=True)
        return failed
    if look.began == Start.FIRST:
        err.print(f"watching {label} from {look.head} (earlier commits: --since REF)", highlight=False)
    elif look.began == Start.REWRITTEN:
        err.print(
            f"warning: {label} was rewritten (force-push?): {look.start} is not an ancestor of {look.head}. "
            f"Nothing from the rewritten history is enqueued; watching from {look.head}. To enqueue some of "
            "it anyway: fleet watch --once --since <commit before it>",
            style="yellow",
            highlight=False,
        )
    elif look.commits:
        counts = ", ".join(f"{look.count(o)} {o.value}" for o in Outcome if look.count(o))
        err.print(f"{len(look.commits)} new commit(s) up to {look.head[:12]}: {counts or 'no config'}")
    return failed


def _report_config(r: ConfigResult, as_json: bool, shown: set[tuple[str, str]], quiet: bool = False) -> bool:
    """Print one config's outcome (human: stdout for runs, stderr for the rest); True if it failed."""
    if as_json:
        print(json.dumps(r.view()), flush=True)
        return r.outcome in (Outcome.INVALID, Outcome.REFUSED)
    if r.outcome == Outcome.ENQUEUED:
        if not quiet:
            out.print(f"enqueued {r.run_id} {r.where}", highlight=False)
        for warning in r.warnings:
            err.print(f"[yellow]warning[/yellow] {r.where}: {warning}", highlight=False)
    elif r.outcome == Outcome.INVALID:
        err.print(f"invalid {r.where}: not enqueued (this commit's version never will be)", style="red")
        err.print(r.message, markup=False, highlight=False)
    elif r.outcome == Outcome.REFUSED:
        if (r.where, r.message) not in shown:
            shown.add((r.where, r.message))
            err.print(f"refused {r.where} (tried again at the next look):", style="red", highlight=False)
            err.print(r.message, markup=False, highlight=False)
    elif r.outcome == Outcome.IN_FLIGHT:
        err.print(f"{r.where}: another process is submitting it as {r.run_id}; looked at again next time")
    elif r.outcome == Outcome.SEEN_INVALID:
        err.print(f"{r.where}: invalid (reported before); not enqueued", style="dim", highlight=False)
    elif r.outcome == Outcome.ALREADY:
        err.print(f"{r.where}: already enqueued as {r.run_id}", style="dim", highlight=False)
    return r.outcome in (Outcome.INVALID, Outcome.REFUSED)


def _stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM or a first Ctrl-C: stop after the current commit; a second Ctrl-C: at once. Returns the
    handlers it replaced."""

    def on_signal(signum: int, _frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    return {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}


def _fail(exc: Exception) -> NoReturn:
    err.print(f"error: {exc}", style="red", markup=False, highlight=False)
    raise typer.Exit(2)
