"""A node is ready only when it can train: its readiness check runs on the node, with the interpreter that
would train, before any training. A node that fails it is given back at once (even one the job would keep
for debugging) and the run fails NODE_BROKEN, naming what is missing, with nothing retried.

Through the fake RunPod, whose pods are real local Ray heads running in the environment their image names
(tests.fakes.node_images): one image lacks peft; another is the node environment on a node that does not
say it is a CPU stand-in, as a real machine would not, so its GPU section finds no GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.node_images import NO_PEFT_IMAGE, REAL_GPU_IMAGE
from tests.integration.clouds import API_KEY, MostLive, fake_state, job_for
from tests.integration.fleetproc import events_of, fleet, fleet_env

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("image", "gpus", "why"),
    [
        (
            NO_PEFT_IMAGE,
            1,
            "peft is missing (ModuleNotFoundError: No module named 'peft'); the node's setup could not "
            "install what it lacks: CalledProcessError",
        ),
        (REAL_GPU_IMAGE, 4, "asked for 4 GPUs, CUDA sees 0"),
    ],
)
def test_a_node_that_cannot_train_fails_node_broken_and_is_given_back(
    home: Path, fake_runpod: str, tmp_path: Path, image: str, gpus: int, why: str
) -> None:
    section = (
        f"runpod:\n  gpu: NVIDIA RTX A5000\n  gpu_count: {gpus}\n  max_bid_per_gpu: 0.5\n"
        f"  image: {image}\n  one_shot: false\n"  # would be kept after a failure, but it cannot train
    )
    env = fleet_env(home, RUNPOD_API_BASE_URL=fake_runpod, RUNPOD_API_KEY=API_KEY)
    watch = MostLive(fake_runpod)
    done = fleet(env, "run", str(job_for(tmp_path, section)), "--json", timeout=300)
    assert watch.stop() == 1
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    view = json.loads(done.stdout)
    assert view["state"] == "FAILED" and view["failure_reason"] == "NODE_BROKEN", view["failure_message"]
    name = f"tf-{view['run_id']}-1"
    assert view["failure_message"].startswith(f"instance {name} cannot train: {why}")

    state = fake_state(fake_runpod)
    assert state["instances"] == [] and state["requests"]["create"] == 1  # given back; never tried again
    evs = events_of(home, view["run_id"])
    types = [e["type"] for e in evs]
    (setup,) = [e["data"] for e in evs if e["type"] == "node.setup"]  # it tried to install what was missing
    assert setup["installed"] == [] and ("error" in setup) == (image == NO_PEFT_IMAGE)
    assert "instance.ready" in types and "node.ready" not in types and "instance.kept" not in types
    assert "instance.terminated" in types
    assert not {"prepare.submitted", "train.submitted", "run.preempted"} & set(types)
