"""The ledger: runs and instances in Redis (AOF on), changed only through optimistic transactions.

Each run is one JSON document. `update_run` reads it under WATCH, lets a function change it and name the
events that change means, and writes the document and those events in one MULTI/EXEC, so a state change
and its events are never seen apart, and two workers acting on one run cannot both win.

Writes are fenced while a stage task acts on a run (`fenced`, set by workers.runner for the task): a write
to that run, or to one of its instances, first checks under the same WATCH that the run's tick key
(broker.dispatch) still holds the task's id, and raises LeaseLost when another task took the run over. A
context variable carries the fence, so no function between the runner and the ledger passes it on, and
writes from elsewhere (the CLI's cancel, the reaper, another thread) are not fenced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis
from pydantic import BaseModel

from core.errors import AlreadyExists, LeaseLost, NotFound
from state import events
from state.keys import (
    INSTANCES_INDEX,
    RUNS_INDEX,
    RUNS_OPEN,
    RUNS_OPEN_BUILT,
    SWEEPS_ACTIVE,
    SWEEPS_INDEX,
    instance_key,
    run_key,
    sweep_key,
    tick_key,
)
from state.models import Instance, InstanceState, Run, Sweep
from state.payloads import Event, Payload

Draft = Payload
"""An event a change writes, before the ledger numbers it in the run's sequence."""
RunChange = Callable[[Run], list[Draft] | None]
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Fence:
    """The stage task acting on a run: writes to the run go through only while its tick holds `owner`."""

    run_id: str
    owner: str


_FENCE: ContextVar[Fence | None] = ContextVar("trainfleet_fence", default=None)


@contextmanager
def fenced(run_id: str, owner: str) -> Iterator[None]:
    """For the duration (in this thread), the ledger's writes to `run_id` are `owner`'s: refused with
    LeaseLost once the run's tick key holds another task's id, or none."""
    token = _FENCE.set(Fence(run_id, owner))
    try:
        yield
    finally:
        _FENCE.reset(token)


class Ledger:
    """Runs, instances and the events their changes produce."""

    def __init__(self, client: redis.Redis[str], events_maxlen: int = 100_000) -> None:
        self.client = client
        self.events_maxlen = events_maxlen

    # runs ---------------------------------------------------------------------------------------
    def create_run(self, run: Run, drafts: list[Draft]) -> Run:
        """Record a new run with its first events; AlreadyExists (nothing written) when its id is taken."""
        key = run_key(run.run_id)
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                if pipe.exists(key):
                    raise AlreadyExists(f"run {run.run_id} exists already")
                pipe.multi()
                for event in self._number(run, drafts):
                    events.append(pipe, event, self.events_maxlen)
                pipe.set(key, run.model_dump_json())
                pipe.zadd(RUNS_INDEX, {run.run_id: run.created_at})
                if not run.state.is_terminal():
                    pipe.sadd(RUNS_OPEN, run.run_id)
                pipe.execute()
            except redis.WatchError:
                raise AlreadyExists(f"run {run.run_id} was created meanwhile") from None
        return run

    def get_run(self, run_id: str) -> Run:
        raw = self.client.get(run_key(run_id))
        if raw is None:
            raise NotFound(f"no run {run_id!r}")
        return Run.model_validate_json(raw)

    def find_run(self, prefix: str) -> Run:
        """A run by its id or an unambiguous prefix of it."""
        return self._find(prefix, RUNS_INDEX, self.get_run, "runs")

    def list_runs(self, limit: int = 50) -> list[Run]:
        return self._newest(RUNS_INDEX, run_key, Run, limit)

    def get_runs(self, run_ids: list[str]) -> dict[str, Run]:
        """The runs that exist among `run_ids`, by id (one round trip)."""
        raws = self.client.mget([run_key(i) for i in run_ids]) if run_ids else []
        found = [Run.model_validate_json(raw) for raw in raws if raw is not None]
        return {run.run_id: run for run in found}

    def update_run(self, run_id: str, change: RunChange) -> Run:
        """Apply `change` to the stored run atomically (retried on conflict); returns the new run."""

        def body(raw: str | None, pipe: redis.client.Pipeline[str]) -> Run:
            if raw is None:
                raise NotFound(f"no run {run_id!r}")
            self._check_fence(pipe, run_id)
            run = Run.model_validate_json(raw)
            drafts = change(run) or []
            run.updated_at = time.time()
            numbered = self._number(run, drafts)
            pipe.multi()
            pipe.set(run_key(run_id), run.model_dump_json())
            if run.state.is_terminal():
                pipe.srem(RUNS_OPEN, run_id)
            for event in numbered:
                events.append(pipe, event, self.events_maxlen)
            return run

        return self._optimistic(run_key(run_id), body)

    def open_runs(self) -> list[Run]:
        """The runs that have not ended (queued, held, going), oldest first: what a budget's worst cases
        count. A ledger older than this index gets it built once, from all its runs."""
        if not self.client.exists(RUNS_OPEN_BUILT):
            self._build_open_runs()
        ids = sorted(str(i) for i in self.client.smembers(RUNS_OPEN))
        found = self.get_runs(ids)
        ended = [i for i in ids if i not in found or found[i].state.is_terminal()]
        if ended:  # put there by a build that raced the run's end: an ended run never opens again
            self.client.srem(RUNS_OPEN, *ended)
        return sorted((r for r in found.values() if not r.state.is_terminal()), key=lambda r: r.created_at)

    def _build_open_runs(self, page: int = 500) -> None:
        for start in range(0, self.client.zcard(RUNS_INDEX), page):
            ids = [str(i) for i in self.client.zrange(RUNS_INDEX, start, start + page - 1)]
            going = [i for i, run in self.get_runs(ids).items() if not run.state.is_terminal()]
            if going:
                self.client.sadd(RUNS_OPEN, *going)
        self.client.set(RUNS_OPEN_BUILT, "1")

    def _find(self, prefix: str, index: str, get: Callable[[str], T], what: str) -> T:
        """`get(prefix)`, or the one id in `index` that starts with `prefix` (NotFound when none or many)."""
        try:
            return get(prefix)
        except NotFound:
            matches = [str(i) for i in self.client.zrange(index, 0, -1) if str(i).startswith(prefix)]
            if len(matches) == 1:
                return get(matches[0])
            if matches:
                raise NotFound(f"{prefix!r} matches {len(matches)} {what}; give more of the id") from None
            raise

    def _newest(self, index: str, key: Callable[[str], str], model: type[M], limit: int) -> list[M]:
        """The newest `limit` documents of `index` (a sorted set by creation time), newest first."""
        ids = self.client.zrevrange(index, 0, limit - 1)
        raws = self.client.mget([key(str(i)) for i in ids]) if ids else []
        return [model.model_validate_json(raw) for raw in raws if raw is not None]

    def _optimistic(self, key: str, body: Callable[[str | None, redis.client.Pipeline[str]], T]) -> T:
        """Run `body(current value, pipeline)` under WATCH `key` (and the fenced run's tick key, if any),
        retried until no one else wrote them in between. `body` calls `pipe.multi()` before queueing its
        writes (or queues none)."""
        fence = _FENCE.get()
        watched = [key] if fence is None else [key, tick_key(fence.run_id)]
        while True:
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(*watched)
                    result = body(cast(str | None, pipe.get(key)), pipe)
                    if pipe.explicit_transaction:
                        pipe.execute()
                    return result
                except redis.WatchError:
                    continue

    def check_fence(self, run_id: str) -> None:
        """LeaseLost now when this thread acts for a stage task on `run_id` that no longer owns it: for what
        must be the owner's alone but is no ledger write (stopping the run's Ray jobs, in a teardown)."""
        self._check_fence(self.client, run_id)

    @staticmethod
    def _check_fence(pipe: redis.client.Pipeline[str] | redis.Redis[str], run_id: str) -> None:
        """LeaseLost when this thread acts for a stage task on `run_id` whose tick is no longer the task's
        (read under WATCH: a change before EXEC retries the write, and so this check)."""
        fence = _FENCE.get()
        if fence is None or fence.run_id != run_id or not run_id:
            return
        owner = cast(str | None, pipe.get(tick_key(run_id)))  # watching: answers at once
        if owner != fence.owner:
            now = f"task {owner}" if owner else "no task (its claim expired)"
            raise LeaseLost(f"run {run_id}: task {fence.owner} lost its claim ({now} owns it); write refused")

    @staticmethod
    def _number(run: Run, drafts: list[Draft]) -> list[Event]:
        out = []
        for payload in drafts:
            run.event_seq += 1
            out.append(
                Event(id=f"{run.run_id}-{run.event_seq}", type=payload.type, run_id=run.run_id, data=payload)
            )
        return out

    # sweeps -------------------------------------------------------------------------------------
    def create_sweep(self, sweep: Sweep, event: Event) -> Sweep:
        with self.client.pipeline(transaction=True) as pipe:
            events.append(pipe, event, self.events_maxlen)
            pipe.set(sweep_key(sweep.sweep_id), sweep.model_dump_json())
            pipe.zadd(SWEEPS_INDEX, {sweep.sweep_id: sweep.created_at})
            pipe.sadd(SWEEPS_ACTIVE, sweep.sweep_id)
            pipe.execute()
        return sweep

    def get_sweep(self, sweep_id: str) -> Sweep:
        raw = self.client.get(sweep_key(sweep_id))
        if raw is None:
            raise NotFound(f"no sweep {sweep_id!r}")
        return Sweep.model_validate_json(raw)

    def find_sweep(self, prefix: str) -> Sweep:
        """A sweep by its id or an unambiguous prefix of it."""
        return self._find(prefix, SWEEPS_INDEX, self.get_sweep, "sweeps")

    def list_sweeps(self, limit: int = 50) -> list[Sweep]:
        return self._newest(SWEEPS_INDEX, sweep_key, Sweep, limit)

    def active_sweeps(self) -> list[str]:
        return sorted(str(s) for s in self.client.smembers(SWEEPS_ACTIVE))

    def update_sweep(self, sweep_id: str, change: Callable[[Sweep], Event | None]) -> Sweep:
        """Apply `change` to the stored sweep atomically; the event it returns (if any) is written with it,
        and a sweep that `change` marks finished leaves the active set in the same transaction."""

        def body(raw: str | None, pipe: redis.client.Pipeline[str]) -> Sweep:
            if raw is None:
                raise NotFound(f"no sweep {sweep_id!r}")
            sweep = Sweep.model_validate_json(raw)
            event = change(sweep)
            sweep.updated_at = time.time()
            pipe.multi()
            pipe.set(sweep_key(sweep_id), sweep.model_dump_json())
            if event is not None:
                events.append(pipe, event, self.events_maxlen)
            if sweep.finished_at is not None:
                pipe.srem(SWEEPS_ACTIVE, sweep_id)
            return sweep

        return self._optimistic(sweep_key(sweep_id), body)

    # instances ----------------------------------------------------------------------------------
    def put_instance(self, instance: Instance) -> None:
        def body(_raw: str | None, pipe: redis.client.Pipeline[str]) -> None:
            self._check_fence(pipe, instance.run_id)
            pipe.multi()
            pipe.set(instance_key(instance.name), instance.model_dump_json())
            pipe.sadd(INSTANCES_INDEX, instance.name)

        self._optimistic(instance_key(instance.name), body)

    def get_instance(self, name: str) -> Instance | None:
        raw = self.client.get(instance_key(name))
        return None if raw is None else Instance.model_validate_json(raw)

    def update_instance(
        self, name: str, from_state: InstanceState | None = None, **changes: Any
    ) -> Instance | None:
        """Change fields of a recorded instance atomically; None when there is no such record, or (with
        `from_state`) when it is not in that state now: then nothing is written, so that of two processes
        making one change (finalize and the reaper, confirming a node gone) one is told it made it, and
        says so."""

        def body(raw: str | None, pipe: redis.client.Pipeline[str]) -> Instance | None:
            if raw is None:
                return None
            inst = Instance.model_validate_json(raw)
            if from_state is not None and inst.state != from_state:
                return None
            inst = inst.model_copy(update=changes)
            self._check_fence(pipe, inst.run_id)
            inst.updated_at = time.time()
            pipe.multi()
            pipe.set(instance_key(name), inst.model_dump_json())
            return inst

        return self._optimistic(instance_key(name), body)

    def list_instances(self) -> list[Instance]:
        names = sorted(str(n) for n in self.client.smembers(INSTANCES_INDEX))
        raws = self.client.mget([instance_key(n) for n in names]) if names else []
        return [Instance.model_validate_json(raw) for raw in raws if raw is not None]

    def emit(self, event: Event) -> None:
        """Append an event that changes no run (reaper actions and the like)."""
        with self.client.pipeline(transaction=False) as pipe:
            events.append(pipe, event, self.events_maxlen)
            pipe.execute()
