"""The tiny job on a rented node: `fleet run` against a local fake of the cloud's API, whose "pod" is a
real local Ray head, so the job provisions, trains and gives the node back for real.

The fake's node keeps its files under a root of its own (as a rented node would), so these runs also show
that the job's datasets travel to the node with its Ray jobs and that the results come back to the fleet.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from providers.local.client import node_python
from tests.factories import EXAMPLE_YAML
from tests.fakes.hub import FakeHub
from tests.integration.clouds import API_KEY, HF_TOKEN, VAST_KEY, MostLive, fake_state, job_for
from tests.integration.fleetproc import events_of, fleet, fleet_env, secret_hits

pytestmark = pytest.mark.integration


def check_ran_on_the_node_and_gave_it_back(
    home: Path, url: str, done: subprocess.CompletedProcess[str], provider: str, api_key: str
) -> list[dict[str, Any]]:
    """What every cloud run must show; returns the run's events for the caller's own checks."""
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    view = json.loads(done.stdout)
    assert view["state"] == "SUCCEEDED" and view["provider"] == provider
    assert view["metrics"]["eval_loss"] < view["metrics"]["eval_loss_first"]

    state = fake_state(url)
    assert state["instances"] == []  # no live instance of ours is left
    assert state["requests"]["create"] == 1  # and exactly one was ever made
    evs = events_of(home, view["run_id"])
    assert "instance.terminated" in [e["type"] for e in evs]
    # What the node cost (its price over the minute or so it was up): in the last event and in the status.
    (succeeded,) = [e["data"] for e in evs if e["type"] == "run.succeeded"]
    assert 0 < succeeded["cost_usd"] <= view["cost_usd"] < 0.05

    # The datasets travelled with the Ray jobs: the node read its own copies, not this machine's files.
    (fetched,) = [e["data"] for e in evs if e["type"] == "prepare.fetched"]
    data_dir = str((home.parent / "job" / "data").resolve())
    assert fetched["dataset_files"] and all(
        "/datasets/0/" in f and not f.startswith((data_dir, str(EXAMPLE_YAML.parent)))
        for f in fetched["dataset_files"]
    )
    # The node trained into its own root; the results came back into the run's output directory.
    (pulled,) = [e["data"] for e in evs if e["type"] == "finalize.pulled"]
    local = Path(view["output_dir"])
    assert pulled["output_dir"] == str(local) and pulled["files"] >= 4
    (on_node,) = (home.parent / "fake" / "node-roots").glob(f"*/runs/{view['run_id']}/outputs")
    for name in ("adapter_model.safetensors", "adapter_config.json", "metrics.json", "README.md"):
        assert (local / name).read_bytes() == (on_node / name).read_bytes(), name

    # The node checked and trained in its own environment (the node's software only), never the fleet's.
    (ready,) = [e["data"]["check"] for e in evs if e["type"] == "node.ready"]
    (started,) = [e["data"] for e in evs if e["type"] == "train.started"]
    node_bin = node_python().parent  # its bin/python or bin/python3.11, not the fleet's
    assert Path(started["python"]).parent == Path(ready["executable"]).parent == node_bin
    assert node_bin != Path(sys.executable).parent
    assert ready["cpu_standin"] and ready["versions"]["peft"] and not ready["cuda"]
    # Its image had all of the node's software: the setup (the real program, run as the start script
    # would) installed nothing.
    (setup,) = [e["data"] for e in evs if e["type"] == "node.setup"]
    assert setup["installed"] == [] and "error" not in setup and setup["seconds"] < 30

    assert secret_hits(home, api_key) == []  # the API key reached no ledger, event or file
    assert api_key not in done.stdout + done.stderr
    return evs


# The plain path is the vast.ai test's; this one runs the same job with a create that errors after the pod
# was made, which must still end with one pod used and none left.
@pytest.mark.parametrize("fault", ["error_after_create"])
def test_a_runpod_job_runs_on_the_fakes_node_and_gives_it_back(
    home: Path, fake_runpod: str, tmp_path: Path, fault: str | None
) -> None:
    section = (
        "runpod:\n  gpu: NVIDIA RTX A5000\n  gpu_count: 1\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
        "  pod_type: INTERRUPTABLE\n"
    )
    job = job_for(tmp_path, section)
    env = fleet_env(home, RUNPOD_API_BASE_URL=fake_runpod, RUNPOD_API_KEY=API_KEY)
    if fault is not None:  # the create answers an error although RunPod made the pod
        body = json.dumps([{"op": "create", "kind": fault}]).encode()
        urllib.request.urlopen(
            urllib.request.Request(f"{fake_runpod}/_fake/faults", data=body), timeout=10
        ).close()
    watch = MostLive(fake_runpod)

    done = fleet(env, "run", str(job), "--json", timeout=420)
    assert watch.stop() == 1  # never more than one pod for the run, at any moment
    evs = check_ran_on_the_node_and_gave_it_back(home, fake_runpod, done, "runpod", API_KEY)
    (requested,) = [e for e in evs if e["type"] == "instance.requested"]
    # An interruptible pod at the minimum bid (the fake's A5000 spot floor), never above the cap.
    assert 0 < requested["data"]["price_per_hour"] <= 0.5


def test_a_vastai_job_runs_on_the_fakes_node_and_gives_it_back(
    home: Path, fake_vastai: str, tmp_path: Path
) -> None:
    # The fake's RTX A5000 (offer 1001): a community host, 8 vCPUs, 32 GB, a minimum bid of $0.09/h.
    section = (
        "vastai:\n  gpu: RTX_A5000\n  gpu_count: 1\n  max_bid_per_gpu: 0.5\n  cloud_type: ALL\n"
        "  min_vcpu_count: 8\n  min_memory_in_gb: 29\n  one_shot: true\n  pod_type: INTERRUPTABLE\n"
    )
    job = job_for(tmp_path, section, extra="hub_model_id: tester/tiny-vast\n")
    with FakeHub(home=tmp_path / "hub", token=HF_TOKEN) as hub:
        env = fleet_env(
            home, VAST_URL=fake_vastai, VAST_API_KEY=VAST_KEY, HF_TOKEN=HF_TOKEN, HF_ENDPOINT=hub.url,
            HF_HUB_DISABLE_XET="1",
        )  # fmt: skip
        done = fleet(env, "run", str(job), "--json", timeout=420)
        evs = check_ran_on_the_node_and_gave_it_back(home, fake_vastai, done, "vastai", VAST_KEY)
        (repo,) = hub.state()["repos"]
    (requested,) = [e for e in evs if e["type"] == "instance.requested"]
    assert requested["data"]["price_per_hour"] == 0.09  # the offer's minimum bid, under the cap
    # The node pushed to the hub with the token it got in its environment; the token stayed out of the
    # fleet's records, and out of what the fake cloud shows (env names only).
    (pushed,) = [e["data"] for e in evs if e["type"] == "finalize.pushed"]
    assert pushed["repo_id"] == repo["id"] == "tester/tiny-vast" and pushed["commit"] == repo["head"]
    assert "adapter_model.safetensors" in {f["path"] for f in repo["files"]}
    assert secret_hits(home, HF_TOKEN) == [] and HF_TOKEN not in json.dumps(fake_state(fake_vastai))
