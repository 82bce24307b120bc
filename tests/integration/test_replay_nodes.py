"""The fake clouds' light nodes (tests.fakes.replay): a run on a fake RunPod whose pod replays a recorded
trainer goes through every stage of the real fleet (readiness check, fetch, train, pack, terminate) in
seconds, with no Ray and no torch on the node. What bench/scale.py builds on."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from state.keys import NODE_SECRETS
from state.stages import Stage
from tests.fakes import FakeRunPod
from tests.fakes.nodes import Boot
from tests.fakes.replay import EMITTED, JOURNAL, OUTPUT_FILES, Recording
from tests.integration.clouds import API_KEY, MostLive, fake_state, job_for
from tests.integration.fleetproc import events_of, fleet, fleet_env, redis_of

pytestmark = pytest.mark.integration
SECTION = "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
TRAIN_S = 6.0  # long enough that a task per poll would show: a dozen train tasks and more
RECEIVED = re.compile(r"Task (trainfleet\.\w+)\[[0-9a-f]+\] received")


@pytest.fixture
def replay_cloud(tmp_path: Path) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="replay") as fake:
        fake.nodes.replayer.train_s = TRAIN_S  # type: ignore[attr-defined]
        yield fake


@pytest.mark.timeout(180)
def test_a_run_on_a_replay_node_goes_through_every_stage(
    home: Path, replay_cloud: FakeRunPod, tmp_path: Path
) -> None:
    url = replay_cloud.url
    env = fleet_env(home, RUNPOD_API_BASE_URL=url, RUNPOD_API_KEY=API_KEY)
    watch = MostLive(url)
    started = time.monotonic()
    done = fleet(env, "run", str(job_for(tmp_path, SECTION)), "--json", timeout=150)
    took = time.monotonic() - started
    assert watch.stop() == 1
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    view = json.loads(done.stdout)
    assert view["state"] == "SUCCEEDED" and view["provider"] == "runpod"
    assert took < 60, f"a replayed run took {took:.0f} s"

    evs = events_of(home, view["run_id"])
    types = [e["type"] for e in evs]
    # Every recorded line but the last, DONE: no event, it says the job's exit is not waited for.
    recorded = [record["kind"] for _t, record in Recording.load().train if record["kind"] != "done"]
    # Every recorded progress line reached the ledger once, in order, as its event.
    relayed = [t.removeprefix("train.") for t in types if t.removeprefix("train.") in set(recorded)]
    assert relayed == recorded and {"step", "eval", "checkpoint", "finished"} <= set(relayed)
    for event in evs:
        if event["type"] in ("train.step", "train.eval", "prepare.fetched"):
            # Stamped by the node when it appeared in the log; in the ledger after that: relayed by the
            # watcher as it was printed (the run waits parked, with no task), a tick or two later.
            assert 0 <= event["time"] - event["data"][EMITTED] < 5
    steps = [e["time"] for e in evs if e["type"] == "train.step"]
    assert steps[-1] - steps[0] > TRAIN_S / 2  # as it happened, not all at the end
    received: Counter[str] = Counter()
    for log in (home / "logs").glob("worker-*.log"):
        received.update(RECEIVED.findall(log.read_text(errors="replace")))
    # A task per poll sent a train task each 0.5 s here; parked, the train stage is sent, then woken once.
    assert received[Stage.TRAIN.task_name] <= 3, received
    assert sum(received[s.task_name] for s in Stage) <= 20, received
    assert view["metrics"]["eval_loss"] < view["metrics"]["eval_loss_first"]
    # The run's own directories in the replayed lines, not the recording's placeholders.
    (finished,) = [e["data"] for e in evs if e["type"] == "train.finished"]
    assert finished["output_dir"] == f"runs/{view['run_id']}/outputs"

    # The pack job's lines were unpacked into the run's output directory.
    (pulled,) = [e["data"] for e in evs if e["type"] == "finalize.pulled"]
    assert pulled["files"] == len(OUTPUT_FILES)
    for name, text in OUTPUT_FILES.items():
        assert (Path(view["output_dir"]) / name).read_text() == text
    # The node ran each job once, and was given back.
    journal = [json.loads(line) for line in (tmp_path / "fake" / JOURNAL).read_text().splitlines()]
    assert [row["kind"] for row in journal] == ["check", "fetch", "train", "pack"]
    state = fake_state(url)
    assert state["instances"] == [] and state["requests"]["create"] == 1
    # Seen gone in the shared list (no list call of its own), and its tokens (sealed in Redis) forgotten.
    (gone,) = [e["data"]["instance"] for e in evs if e["type"] == "instance.terminated"]
    assert not [f for f in redis_of(home).hkeys(NODE_SECRETS) if f.startswith(gone)]


@pytest.mark.timeout(180)
def test_a_trainer_whose_exit_hangs_after_its_last_line_holds_neither_the_run_nor_the_node(
    home: Path, replay_cloud: FakeRunPod, tmp_path: Path
) -> None:
    """After its DONE line the train job's process only exits (Python's and torch's teardown, seconds): the
    run goes on at once, and a teardown that hangs (NCCL's, on a GPU node) is stopped, not waited for."""
    replay_cloud.nodes.replayer.exit_s = 600  # type: ignore[attr-defined]
    env = fleet_env(home, RUNPOD_API_BASE_URL=replay_cloud.url, RUNPOD_API_KEY=API_KEY)
    started = time.monotonic()
    done = fleet(env, "run", str(job_for(tmp_path, SECTION)), "--json", timeout=150)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    view = json.loads(done.stdout)
    assert view["state"] == "SUCCEEDED" and took < 60, (view["state"], took)
    assert replay_cloud.nodes.replayer.stopped == [f"{view['run_id']}-1-train"]  # type: ignore[attr-defined]
    assert fake_state(replay_cloud.url)["instances"] == []


def test_a_replay_node_answers_only_with_its_token(replay_cloud: FakeRunPod) -> None:
    nodes = replay_cloud.nodes
    nodes.start("lone", Boot("right-token", {}))
    port = None
    while port is None:
        port = nodes.ready_port("lone", "right-token")
        time.sleep(0.05)
    version = f"http://127.0.0.1:{port}/api/version"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(version, headers=headers), timeout=5)
        assert refused.value.code == 401
    right = urllib.request.Request(version, headers={"Authorization": "Bearer right-token"})
    with urllib.request.urlopen(right, timeout=5) as reply:
        assert reply.status == 200
    nodes.stop("lone")
