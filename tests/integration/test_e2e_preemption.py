"""A run whose interruptible node is preempted twice still SUCCEEDS: each time the fleet ends what is left
of the lost pod, rents a new one and the trainer resumes from the newest checkpoint on the (fake) hub. The
fake RunPod's pods are real local Ray heads; the worker is a real `fleet up` with beat."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.fakes.hub import FakeHub
from tests.integration.clouds import API_KEY, HF_TOKEN, MostLive, fake_state, job_for
from tests.integration.fleetproc import Worker, events_of, fleet_env, fleet_json, secret_hits, wait_for_end
from tests.integration.fleetproc import wait_until as wait

pytestmark = pytest.mark.integration
SECTION = "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  pod_type: INTERRUPTABLE\n"
# One process (no Ray Train start-up each time), a checkpoint every 10 steps, each one pushed to the hub.
EXTRA = "hub_model_id: tester/preempted\nhub_strategy: checkpoint\n"


def preempt(url: str, pod_id: str) -> None:
    request = urllib.request.Request(f"{url}/_fake/preempt/{pod_id}", data=b"", method="POST")
    urllib.request.urlopen(request, timeout=10).close()


def test_a_run_preempted_twice_resumes_from_its_checkpoints_and_succeeds(
    home: Path, fake_runpod: str, tmp_path: Path
) -> None:
    job = job_for(tmp_path, SECTION, extra=EXTRA)
    job.write_text(
        job.read_text().replace("use_ray: true", "use_ray: false").replace("save_steps: 40", "save_steps: 10")
    )
    with FakeHub(home=tmp_path / "hub", token=HF_TOKEN) as hub:
        env = fleet_env(
            home, RUNPOD_API_BASE_URL=fake_runpod, RUNPOD_API_KEY=API_KEY, HF_TOKEN=HF_TOKEN,
            HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", FLEET_PREEMPT_BACKOFF_S="1",
        )  # fmt: skip
        worker = Worker(env, home / "worker.log")
        watch = MostLive(fake_runpod)
        try:
            (queued,) = fleet_json(env, "enqueue", str(job))
            run_id = queued["run_id"]
            preempted_at: list[int] = []
            for n in (1, 2):

                def checkpointed(since: int = n) -> int | None:
                    """The step of a checkpoint on the hub since the (n-1)th preemption."""
                    evs = events_of(home, run_id)
                    assert "run.failed" not in [e["type"] for e in evs], evs[-3:]
                    lost = [i for i, e in enumerate(evs) if e["type"] == "run.preempted"]
                    after = evs[lost[since - 2] + 1 :] if since > 1 else evs
                    steps = [e["data"]["step"] for e in after if e["type"] == "train.checkpoint"]
                    return steps[-1] if steps and after[-1]["type"] != "train.finished" else None

                preempted_at.append(wait(checkpointed, 300, f"a checkpoint on node {n}", every=0.2))
                (pod,) = fake_state(fake_runpod)["instances"]
                preempt(fake_runpod, str(pod["id"]))
                wait(
                    lambda n=n: [e["type"] for e in events_of(home, run_id)].count("run.preempted") == n,
                    120,
                    f"preemption {n} to be seen",
                )
            view = wait_for_end(env, run_id, timeout=420)
        finally:
            most = watch.stop()
            worker.stop()

        assert view["state"] == "SUCCEEDED", view
        evs = events_of(home, run_id)
        kinds = [e["type"] for e in evs]
        lost = [e["data"] for e in evs if e["type"] == "run.preempted"]
        assert [p["instance"] for p in lost] == [f"tf-{run_id}-1", f"tf-{run_id}-2"]
        assert [p["preemption"] for p in lost] == [1, 2]
        # Each new node went on from a checkpoint at least as new as the one seen before the preemption.
        resumed = [e["data"] for e in evs if e["type"] == "train.resumed"]
        assert len(resumed) == 2, kinds
        assert all(r["step"] >= at for r, at in zip(resumed, preempted_at, strict=True)), (
            resumed,
            preempted_at,
        )
        # Three pods in all, never two at once; none left; preemptions are not the trainer's restarts.
        assert kinds.count("instance.requested") == 3 and most == 1
        assert fake_state(fake_runpod)["instances"] == []
        assert "train.restarted" not in kinds and kinds.count("train.finished") == 1
        assert view["metrics"]["eval_loss"] < view["metrics"]["eval_loss_first"]
        assert json.loads(json.dumps(hub.state()["repos"]))[0]["id"] == "tester/preempted"
    assert secret_hits(home, HF_TOKEN) == [] and secret_hits(home, API_KEY) == []
