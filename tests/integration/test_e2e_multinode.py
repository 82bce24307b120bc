"""One run across two rented nodes, as one Ray cluster: the tiny job with `num_nodes: 2` against the fake
RunPod, whose pods are real local Ray nodes. Pod 0 runs the head; pod 1's start joins it over the fake's
private network (RunPod's global networking: `<head pod>.runpod.internal:6379`, the head's token). With
one CPU on each node, the job's two Ray Train workers must run on two different nodes: the trainer reads
each worker's node from Ray, and the fleet's `node.joined` events read the cluster from the head's State
API. Both pods mount the run's network volume, where the run's files and results live.

And the other side of all-or-nothing: a cluster one of whose pods never comes up fails at the deadline,
and every pod of the run is terminated."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from providers.local.client import node_python
from state.keys import RUNS_INDEX, run_key
from tests.fakes import FakeRunPod
from tests.integration.clouds import API_KEY, MostLive, fake_state, job_for
from tests.integration.fleetproc import REPO, events_of, fleet, fleet_env, ledger_of, wait_until

pytestmark = pytest.mark.integration
ENDING_EVENTS = ("instance.terminating", "instance.terminated")
VOLUME = "vol-tiny-cluster"
SECTION = (
    "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
    f"  num_nodes: 2\n  network_volume_id: {VOLUME}\n"
)


@pytest.fixture
def cluster_cloud(tmp_path: Path) -> Iterator[FakeRunPod]:
    """The fake RunPod with real Ray nodes of one CPU each, and the account's network volume."""
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="ray", node_cpus=1) as fake:
        fake.add_network_volume(VOLUME)
        yield fake


def run_state(env: dict[str, str]) -> tuple[str, str] | None:
    """(run id, state) of the fleet's one run, once there is one."""
    client = ledger_of(env)
    try:
        ids = client.zrange(RUNS_INDEX, 0, -1)
        raw = client.get(run_key(ids[0])) if ids else None
    finally:
        client.close()
    return None if raw is None else (ids[0], json.loads(raw)["state"])


@pytest.mark.timeout(600)
def test_the_tiny_job_on_two_pods_trains_on_both_nodes_and_leaves_no_pod(
    home: Path, cluster_cloud: FakeRunPod, tmp_path: Path
) -> None:
    url = cluster_cloud.url
    job = job_for(tmp_path, SECTION)
    # The workers are pinned to the GPU type by the custom resource Ray gives such a node (as the Ray Train
    # doc pins L40S): placed only where a node offers it, here on both.
    text = job.read_text()
    assert "resources_per_worker:\n  CPU: 1\n" in text
    job.write_text(text.replace("  CPU: 1\n", "  CPU: 1\n  accelerator_type:RTX-A5000: 0.001\n", 1))
    env = fleet_env(home, RUNPOD_API_BASE_URL=url, RUNPOD_API_KEY=API_KEY, FLEET_NODE_READY_TIMEOUT_S="240")
    watch = MostLive(url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet", "run", str(job), "--json"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # While it trains: `fleet node RUN` shows the whole cluster, head and worker, from the head.
        wait_until(lambda: (home / "redis" / "url").exists(), 60, "the fleet's Redis")
        run_id, _ = wait_until(
            lambda: (found := run_state(env)) and found[1] in ("TRAINING", "FAILED", "SUCCEEDED") and found,
            300,
            "the run to train",
        )
        shown = fleet(env, "node", run_id, "--json", timeout=60)
        stdout, stderr = proc.communicate(timeout=480)
    finally:
        most_live = watch.stop()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    view = json.loads(stdout)
    assert view["state"] == "SUCCEEDED" and view["run_id"] == run_id

    assert shown.returncode == 0, shown.stderr[-2000:]
    cluster = json.loads(shown.stdout)
    assert cluster["instance"] == f"tf-{run_id}-1-0"
    assert sorted(n["head"] for n in cluster["nodes"]) == [False, True]
    assert all(
        n["state"] == "ALIVE" and n["cpus"] == 1 and n["accelerator"] == "RTX-A5000" for n in cluster["nodes"]
    )
    assert "Usage" in cluster["status"]  # and `ray status` as Ray prints it
    # And what the head's readiness check found: the node environment, a CPU stand-in for its A5000.
    assert cluster["check"]["cpu_standin"] and cluster["check"]["executable"].startswith(
        str(node_python().parent)
    )

    evs = events_of(home, run_id)
    names = [f"tf-{run_id}-1-0", f"tf-{run_id}-1-1"]
    requested = [e["data"] for e in evs if e["type"] == "instance.requested"]
    assert [(r["instance"], r["node"], r["num_nodes"]) for r in requested] == [
        (names[0], 0, 2),
        (names[1], 1, 2),
    ]
    # Each node's arrival, as the head's State API listed it; the run went on once both were there.
    joined = [e["data"] for e in evs if e["type"] == "node.joined"]
    assert [(j["nodes"], j["of"]) for j in joined] == [(1, 2), (2, 2)]
    assert sorted(j["head"] for j in joined) == [False, True]
    assert [(j["cpus"], j["gpus"], j["accelerator"]) for j in joined] == [(1, 0, "RTX-A5000")] * 2
    types = [e["type"] for e in evs]
    assert types.index("instance.ready") > max(i for i, t in enumerate(types) if t == "node.joined")
    # Where each rank ran, as Ray told each worker: both nodes of the cluster, one rank on each.
    (started,) = [e["data"] for e in evs if e["type"] == "train.started"]
    assert started["num_workers"] == 2 and started["num_nodes"] == 2, started
    assert sorted(started["nodes"]) == sorted(j["node_id"] for j in joined)
    metrics = view["metrics"]
    assert metrics["num_workers"] == 2 and metrics["global_step"] == metrics["total_steps"] == 90
    assert metrics["eval_loss"] < 0.6 * metrics["eval_loss_first"], metrics  # it trains well on two nodes

    # Never more than the two pods; both terminated, none left billing.
    assert most_live == 2
    state = fake_state(url)
    assert state["instances"] == [] and state["requests"]["create"] == 2
    # Each was seen gone (instance.terminated), or, when the fake still listed it at the end of the run's
    # wait for that (a reap interval, longer on a loaded machine), left TERMINATING for the next reap pass
    # to confirm: none runs here once `fleet run` and its worker have left. The fake lists neither (above).
    ended = {e["data"]["instance"]: e["type"] for e in evs if e["type"] in ENDING_EVENTS}
    assert set(ended) == set(names), ended
    client = ledger_of(env)
    try:
        records = [json.loads(client.get(f"tf:instance:{n}") or "{}") for n in names]
    finally:
        client.close()
    assert [r["head"] for r in records] == [None, names[0]]
    # The ledger is never behind the events: TERMINATED where one was seen gone, and TERMINATING or (a reap
    # pass that confirmed it as the worker stopped, its event after `evs` was read) TERMINATED where not.
    for name, record in zip(names, records, strict=True):
        seen = ended[name].split(".")[1].upper()
        assert record["state"] in ({seen, "TERMINATED"} if seen == "TERMINATING" else {seen}), (name, record)
    (succeeded,) = [e["data"] for e in evs if e["type"] == "run.succeeded"]
    assert 0 < succeeded["cost_usd"] < 0.1  # both pods' prices over their time up

    # The run's files lived on the network volume both pods mounted; the results came back from there.
    on_volume = tmp_path / "fake" / "volumes" / VOLUME / "trainfleet" / "runs" / run_id / "outputs"
    local = Path(view["output_dir"])
    for name in ("adapter_model.safetensors", "adapter_config.json", "metrics.json"):
        assert (local / name).read_bytes() == (on_volume / name).read_bytes(), name
    # So did its checkpoints (steps 40 and 80 of 90, whichever node rank 0 ran on) and Ray Train's storage.
    work = on_volume.parent
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["step-40", "step-80"]
    assert (work / "ray").is_dir()


def test_a_pod_that_never_comes_up_fails_the_run_and_every_pod_is_terminated(
    home: Path, tmp_path: Path
) -> None:
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="stub", ready_delay_s=0.2) as fake:
        fake.add_network_volume(VOLUME)
        fake.add_faults([{"op": "create", "kind": "stuck", "every": 2}])  # the second pod never boots
        env = fleet_env(
            home, RUNPOD_API_BASE_URL=fake.url, RUNPOD_API_KEY=API_KEY, FLEET_NODE_READY_TIMEOUT_S="6"
        )
        done = fleet(env, "run", str(job_for(tmp_path, SECTION)), "--json", timeout=240)
        state: dict[str, Any] = fake.state()
    assert done.returncode == 1, done.stderr[-3000:]
    view = json.loads(done.stdout)
    run_id = view["run_id"]
    names = [f"tf-{run_id}-1-0", f"tf-{run_id}-1-1"]
    assert view["state"] == "FAILED" and view["failure_reason"] == "NODE_TIMEOUT"
    assert (
        f"instance {names[1]} not ready after 6 s (1 of 2 instances up, 0 Ray nodes joined)"
        in view["failure_message"]
    )
    # Both pods were made, and both are gone: the one that came up too.
    assert state["requests"]["create"] == 2 and state["instances"] == []
    evs = events_of(home, run_id)
    assert {e["data"]["instance"] for e in evs if e["type"] == "instance.terminated"} == set(names)
    types = [e["type"] for e in evs]
    assert "node.joined" not in types and "prepare.submitted" not in types


# A cluster of two GPU types: the head on an A5000 (its own shape), the other pod an A6000, and the workers
# pinned to the A6000 by the resource Ray gives such a node. Fewer steps: where it trains is the point.
HETERO = SECTION.replace("gpu: NVIDIA RTX A5000", "gpu: NVIDIA RTX A6000") + (
    "  head:\n    gpu: NVIDIA RTX A5000\n    gpu_count: 1\n"
)


@pytest.mark.timeout(600)
def test_a_head_of_its_own_shape_rents_its_gpu_and_the_pinned_workers_train_on_the_other_node(
    home: Path, cluster_cloud: FakeRunPod, tmp_path: Path
) -> None:
    job = job_for(tmp_path, HETERO, "max_steps: 12\n")
    text = job.read_text().replace("eval_steps: 20\n", "eval_steps: 6\n").replace("save_steps: 40\n", "")
    job.write_text(text.replace("  CPU: 1\n", "  CPU: 1\n  accelerator_type:RTX-A6000: 0.001\n", 1))
    env = fleet_env(
        home, RUNPOD_API_BASE_URL=cluster_cloud.url, RUNPOD_API_KEY=API_KEY, FLEET_NODE_READY_TIMEOUT_S="240"
    )
    plan = fleet(env, "validate", str(job), "--plan", "--json", timeout=120)
    assert plan.returncode == 0, plan.stderr[-2000:]
    (planned,) = json.loads(plan.stdout)
    assert planned["head"] == "1 GPU (NVIDIA RTX A5000)" and planned["gpu"] == "NVIDIA RTX A6000"
    assert planned["workers"].startswith("1 Ray Train workers")  # the A6000's one GPU; none on the head
    for of_head, gpu in ((True, "NVIDIA RTX A5000"), (False, "NVIDIA RTX A6000")):  # `fleet offers`, each
        offers = fleet(env, "offers", str(job), *(["--head"] if of_head else []), "--json", timeout=120)
        assert offers.returncode == 0, offers.stderr[-2000:]
        assert {f["gpu"] for f in json.loads(offers.stdout)["fits"]} == {gpu}
        assert ("--head" in offers.stderr) is not of_head  # without it: a word that the head has its own
    done = fleet(env, "run", str(job), "--json", timeout=480)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    view = json.loads(done.stdout)
    run_id = view["run_id"]
    assert view["state"] == "SUCCEEDED"
    evs = events_of(home, run_id)
    # Each pod was rented as its shape says: the head an A5000, the other an A6000 (dearer).
    requested = {
        e["data"]["instance"]: e["data"]["price_per_hour"] for e in evs if e["type"] == "instance.requested"
    }
    head, other = f"tf-{run_id}-1-0", f"tf-{run_id}-1-1"
    assert set(requested) == {head, other} and requested[head] < requested[other], requested
    assert sum(requested.values()) == pytest.approx(planned["price_per_hour"])  # as the plan priced them
    # Ray saw the two GPU types, and placed the one worker on the A6000's node, not on the head.
    joined = {e["data"]["accelerator"]: e["data"] for e in evs if e["type"] == "node.joined"}
    assert sorted(joined) == ["RTX-A5000", "RTX-A6000"] and joined["RTX-A5000"]["head"]
    (started,) = [e["data"] for e in evs if e["type"] == "train.started"]
    assert started["num_workers"] == 1 and started["nodes"] == [joined["RTX-A6000"]["node_id"]], started
    assert view["metrics"]["global_step"] == 12
    state = fake_state(cluster_cloud.url)
    assert state["instances"] == [] and state["requests"]["create"] == 2
    assert {e["data"]["instance"] for e in evs if e["type"] == "instance.terminated"} == {head, other}
