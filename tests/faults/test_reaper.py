"""F5: the reaper under faults. Orphans (instances of ours with no ledger row: what a crash between the
create call and the ledger write leaves) must be terminated once, anybody else's never, and one reaper acts
at a time (the Redis lock with a TTL):

- two reapers started at the same moment in this process, against slow terminate calls;
- the worker killed -9 twice in the middle of a reap (inside the list call, then inside a terminate):
  the dead reaper's lock expires and the next one finishes the job;
- two `fleet up` (each with its own beat) on one fleet: orphans terminated once each, and runs whose chain
  of tasks died kicked once each. They run as two machines do, each with its own home. (Two `fleet up` on
  one home used to share a celerybeat-schedule file, and their beats could die of it; beat now keeps its
  schedule in memory.)
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
from collections import Counter
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from broker.dispatch import Dispatcher
from providers.base import LaunchRequest, ProviderContext
from providers.runpod.provider import RunPodProvider
from providers.runpod.section import RunPodSection
from providers.runpod.settings import RunPodSettings
from providers.world import World, load_fleet_settings
from service import runs as svc
from state.keys import EVENTS_STREAM, tick_key
from state.ledger import Draft, Ledger
from state.models import Run
from state.payloads import RunCancelRequested
from state.stages import RunState, Stage
from tests.factories import RUNPOD_SECTION, light_job_file
from tests.fakes import FakeCloud, FakeRunPod, Instance
from tests.faults.canaries import CANARIES
from tests.faults.case import Case
from tests.faults.direct import DirectFleet
from tests.faults.live import LiveFleet
from tests.integration.fleetproc import wait_until
from workers.stages.reap import Report, reap_once

pytestmark = pytest.mark.faults


def stub_runpod(case: Case, tmp_path: Path) -> FakeCloud:
    """The fake RunPod with nodes that never get ready (nothing here needs them to)."""
    return case.cloud(FakeRunPod, tmp_path / "fake", nodes="stub", ready_delay_s=3600)


def make_orphans(fake: FakeCloud, home: Path, count: int, prefix: str = "orphan") -> list[str]:
    """`count` instances of ours that no ledger knows (made through the real provider), and one of
    somebody else's on the same account."""
    context = ProviderContext(
        home=home,
        credentials={"RUNPOD_API_KEY": SecretStr(CANARIES["RUNPOD_API_KEY"])},
        urls={"runpod": fake.url},
        clouds={"runpod": RunPodSettings(**fake.proxy.values())},
    )
    provider = RunPodProvider(context)
    names = [f"tf-{prefix}{i}-1" for i in range(count)]
    for name in names:
        provider.launch(LaunchRequest(name, name, RunPodSection(gpu="NVIDIA RTX A5000")))
    foreign = Instance(f"someone-{prefix}", f"someones-{prefix}", "NVIDIA RTX A5000", 1, 0.27, None, {})
    fake.add_instance(foreign)
    return names


def reap_events(client: redis.Redis[str]) -> Counter[str]:
    """How often each instance was reported terminated by a reaper."""
    found: Counter[str] = Counter()
    for _sid, fields in client.xrange(EVENTS_STREAM):
        event = json.loads(fields["event"])
        if event["type"] == "reap.terminated":
            found[event["data"]["instance"]] += 1
    return found


def test_two_reapers_at_once_act_once_in_process(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = stub_runpod(case, tmp_path)
    orphans = make_orphans(fake, tmp_path / "maker", 4)
    fleet = DirectFleet(case, redis_url, tmp_path / "fleet", [fake], monkeypatch)
    # A second reaper: its own Redis connection and its own provider client, as another process has.
    client: redis.Redis[str] = redis.Redis.from_url(redis_url, decode_responses=True)
    case.stack.callback(client.close)
    other = dataclasses.replace(
        fleet.ctx,
        redis=client,
        ledger=Ledger(client),
        dispatcher=Dispatcher(fleet.ctx.dispatcher.app, client, fleet.settings.stall_after_s),
        world=fleet.ctx.world.sharing(client),
    )
    # Slow terminate calls (0.3 s each, well inside the client's timeout): the two passes overlap.
    fake.add_faults([{"op": "terminate", "kind": "timeout", "delay": 0.3, "times": len(orphans)}])
    start = threading.Barrier(2)
    did: list[Report | None] = []

    def reaper(ctx: object) -> None:
        start.wait()
        did.append(reap_once(ctx))  # type: ignore[arg-type]

    threads = [threading.Thread(target=reaper, args=(c,)) for c in (fleet.ctx, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    case.notes["passes"] = [None if d is None else vars(d) for d in did]
    case.check()

    assert len(did) == 2 and None in did  # the other reaper found the lock taken and stood down
    (acted,) = [d for d in did if d is not None]
    assert sorted(acted.terminated) == orphans  # all of them, once
    assert reap_events(redis_client) == dict.fromkeys(orphans, 1)
    assert fake.state()["requests"]["terminate"] == len(orphans)
    assert [row["name"] for row in fake.state()["instances"]] == ["someones-orphan"]  # not ours: untouched


def test_worker_killed_in_the_middle_of_a_reap(case: Case, tmp_path: Path) -> None:
    fake = stub_runpod(case, tmp_path)
    orphans = make_orphans(fake, tmp_path / "maker", 3)
    fleet = LiveFleet(case, tmp_path / "fleet", [fake], FLEET_ORPHAN_GRACE_S="0")
    # The first list and the first terminate take 3 s (the client waits 30): long enough to kill in.
    fake.add_faults(
        [
            {"op": "list", "kind": "timeout", "delay": 3.0},
            {"op": "terminate", "kind": "timeout", "delay": 3.0},
        ]
    )
    worker = fleet.worker()
    for op in ("list", "terminate"):
        wait_until(
            lambda o=op: fake.state()["requests"].get(o, 0) >= 1, 90, f"a reaper's {op} call", every=0.05
        )
        fleet.kill(worker, f"reap:{op}")
        worker = fleet.worker()
    wait_until(lambda: not fleet_instances(fake), 90, "the orphans to be gone")
    case.check()

    assert fake.state()["requests"]["terminate"] == len(orphans)  # the interrupted one was not sent again
    assert set(reap_events(fleet.redis)) <= set(orphans)
    assert [row["name"] for row in fake.state()["instances"]] == ["someones-orphan"]


def fleet_instances(fake: FakeCloud) -> list[str]:
    return [row["name"] for row in fake.state()["instances"] if row["name"].startswith("tf-")]


REAP_INTERVAL_S = 2.0  # fleet_env's FLEET_REAP_INTERVAL_S
SENT_REAP = b"Sending due task reap"  # what a live beat logs as it sends the reaper


def stuck_runs(case: Case, fleet: LiveFleet, job: Path, count: int) -> list[str]:
    """Runs whose chain of tasks died: queued while no worker ran, then their messages and owners lost.
    Each is asked to cancel, so the task a reaper kicks ends it at once (no node needed)."""
    runs = [fleet.enqueue(job) for _ in range(count)]
    here = svc.Fleet.connect(World.of(load_fleet_settings(fleet.env)))

    def ask_cancel(r: Run) -> list[Draft]:
        # As `fleet cancel` records it while a worker serves; with none up it would end a queued run at once
        # (service.runs._end_queued), and nothing would be left for a reaper's kick.
        r.cancel_requested = True
        return [RunCancelRequested(state=r.state.value)]

    for run_id in runs:
        here.ledger.update_run(run_id, ask_cancel)
        fleet.redis.delete(tick_key(run_id))
        case.expect(run_id, RunState.CANCELLED)
    fleet.redis.delete(Stage.PROVISION.value)
    return runs


@pytest.mark.faults_full
def test_two_fleets_ups_with_their_beats_reap_once(case: Case, tmp_path: Path) -> None:
    """Two machines (each its own home) run `fleet up` with its beat against one Redis."""
    fake = stub_runpod(case, tmp_path)
    orphans = make_orphans(fake, tmp_path / "maker", 4)
    fleet = LiveFleet(case, tmp_path / "fleet", [fake], FLEET_ORPHAN_GRACE_S="0")
    runs = stuck_runs(case, fleet, light_job_file(tmp_path / "job", RUNPOD_SECTION), 3)
    # Slow terminate calls (0.5 s each): a pass takes about a reap interval, so the beats' passes overlap.
    fake.add_faults([{"op": "terminate", "kind": "timeout", "delay": 0.5, "times": len(orphans)}])
    fleet.worker()
    fleet.worker(home=tmp_path / "machine-2")
    wait_until(lambda: not fleet_instances(fake), 90, "the orphans to be gone")
    case.end_timeout_s = 60  # a kicked run ends within seconds
    case.check()

    assert reap_events(fleet.redis) == dict.fromkeys(orphans, 1)  # each terminated by one reaper, once
    assert fake.state()["requests"]["terminate"] == len(orphans)
    for run_id in runs:
        evs = fleet.events(run_id)
        kicks = [e["time"] for e in evs if e["type"] == "run.kicked"]
        assert kicks and evs[-1]["type"] == "run.cancelled", evs
        # Never kicked twice in one reap cycle (a kicked task that was slow to start may be kicked again,
        # but only once its tick has expired, FLEET_STALL_AFTER_S later).
        assert all(b - a >= REAP_INTERVAL_S for a, b in itertools.pairwise(kicks)), kicks
    assert all(SENT_REAP in path.read_bytes() for path in case.logs)  # both beats were alive and sending
