"""Workers on several machines: two worker groups, each with a home of its own (its own secrets, logs and
local state), share one Redis and one runs directory. One group provisions, the other prepares, trains and
finalizes: the node's token made by the first reaches the second only sealed through Redis
(providers.sealed), each stage runs once, and the node is given back. A third home submits, as a user's
laptop would."""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cryptography.fernet import Fernet

from core.errors import FailureReason
from providers.sealed import KEY_FILE
from service.embedded import ensure_redis
from state.keys import NODE_SECRETS
from state.stages import Stage
from tests.fakes import FakeRunPod
from tests.integration.clouds import API_KEY, fake_state, job_for
from tests.integration.fleetproc import (
    Worker,
    events_of,
    fleet_env,
    fleet_json,
    ledger_of,
    wait_for_end,
    wait_until,
)
from workers.process import missing_queues

pytestmark = pytest.mark.integration
SECTION = "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
RECEIVED = re.compile(r"Task (trainfleet\.\w+)\[[0-9a-f]+\] received")
FIRST, REST = Stage.PROVISION, (Stage.PREPARE, Stage.TRAIN, Stage.FINALIZE)


def received(log: Path) -> Counter[str]:
    """The tasks a worker group's log says it received, by name."""
    return Counter(RECEIVED.findall(log.read_text(errors="replace")))


@contextlib.contextmanager
def two_groups(env_a: dict[str, str], env_b: dict[str, str], logs: Path) -> Iterator[redis.Redis[str]]:
    """Machine A's worker group on the provision queue, machine B's on the others (logs in `logs`), both
    serving before this yields a client on their Redis; both stopped after."""
    groups = [
        Worker(env_a, logs / "a.log", "worker", "-Q", FIRST.value),
        Worker(env_b, logs / "b.log", "worker", "-Q", ",".join(s.value for s in REST)),
    ]
    try:
        client = ledger_of(env_a)
        wait_until(lambda: not missing_queues(client), 60, "both groups' queues")
        yield client
    finally:
        for group in groups:
            group.stop()


@pytest.mark.timeout(240)
def test_two_worker_groups_with_homes_of_their_own_share_the_runs(home: Path, tmp_path: Path) -> None:
    shared_runs = tmp_path / "shared-runs"  # an NFS mount or a volume, at the same path on each machine
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="replay") as cloud:
        cloud.nodes.replayer.train_s = 2.0  # type: ignore[attr-defined]
        common = {
            "REDIS_URL": ensure_redis(home),  # machine A's Redis, the fleet's one
            "FLEET_RUNS_DIR": str(shared_runs),
            "FLEET_SEAL_KEY": Fernet.generate_key().decode(),
            "RUNPOD_API_BASE_URL": cloud.url,
            "RUNPOD_API_KEY": API_KEY,
        }
        a, b, laptop = home, tmp_path / "machine-b", tmp_path / "laptop"
        env_a, env_b, env_laptop = (fleet_env(h, **common) for h in (a, b, laptop))
        with two_groups(env_a, env_b, tmp_path) as client:
            (queued,) = fleet_json(env_laptop, "enqueue", str(job_for(tmp_path, SECTION)))
            view = wait_for_end(env_laptop, queued["run_id"], timeout=150)
            leftover = client.hgetall(NODE_SECRETS)
        state = fake_state(cloud.url)

    assert view["state"] == "SUCCEEDED", view
    # Each group ran its own stages and nothing else; no stage ran twice.
    by_a, by_b = received(tmp_path / "a.log"), received(tmp_path / "b.log")
    assert set(by_a) == {FIRST.task_name}, by_a
    assert {s.task_name for s in REST} <= set(by_b) and FIRST.task_name not in by_b, by_b
    evs = events_of(a, view["run_id"])
    once = (
        "instance.requested",
        "instance.ready",
        "prepare.fetched",
        "train.started",
        "train.finished",
        "instance.terminated",
    )
    counts = Counter(e["type"] for e in evs)
    assert all(counts[t] == 1 for t in once), counts
    assert state["instances"] == [] and state["requests"]["create"] == 1

    # The results landed in the shared runs directory, not under any machine's home.
    assert Path(view["output_dir"]).is_relative_to(shared_runs)
    assert any(Path(view["output_dir"]).iterdir())
    # The node's token crossed only through Redis, sealed, and was forgotten with the node: no machine's
    # home ever held it, and no machine made a seal key of its own.
    assert leftover == {}
    for machine in (a, b, laptop):
        assert not (machine / "secrets" / "nodes").exists() or not any(
            (machine / "secrets" / "nodes").iterdir()
        )
        assert not (machine / "secrets" / KEY_FILE).exists()


@pytest.mark.timeout(240)
def test_a_machine_with_another_seal_key_fails_the_run_by_name_and_gives_the_node_back(
    home: Path, tmp_path: Path
) -> None:
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="replay") as cloud:
        common = {
            "REDIS_URL": ensure_redis(home),
            "FLEET_RUNS_DIR": str(tmp_path / "shared-runs"),
            "RUNPOD_API_BASE_URL": cloud.url,
            "RUNPOD_API_KEY": API_KEY,
        }
        env_a = fleet_env(home, **common, FLEET_SEAL_KEY=Fernet.generate_key().decode())
        env_b = fleet_env(tmp_path / "machine-b", **common)  # forgot FLEET_SEAL_KEY: makes one of its own
        with two_groups(env_a, env_b, tmp_path):
            (queued,) = fleet_json(env_a, "enqueue", str(job_for(tmp_path, SECTION)))
            view = wait_for_end(env_a, queued["run_id"], timeout=150)
            wait_until(lambda: fake_state(cloud.url)["instances"] == [], 30, "the pod to be given back")
    assert view["state"] == "FAILED" and view["failure_reason"] == FailureReason.AUTH_FAILED.value, view
    assert "FLEET_SEAL_KEY" in view["failure_message"], view["failure_message"]
