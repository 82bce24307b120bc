"""A job's `entry` script, run by the prepare stage on a rented node before the fetch: through `fleet run`
against the fake RunPod, whose pod is a real local Ray head.

The scripts print the node's HF_TOKEN (which a node gets when its job needs it: these jobs push to a fake
Hub, `hub_model_id`, workers.node_secrets): what reaches the fleet's events and failure message must have
it taken out. The first writes `$HF_TOKEN` in the job file itself: Ray expands `$NAME` in a Ray job's env
values on the node, so the TrainJob (which carries the job file the model card shows) travels in base64;
else the card would publish the node's token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.hub import FakeHub
from tests.integration.clouds import API_KEY, HF_TOKEN, fake_state, job_for
from tests.integration.fleetproc import events_of, fleet, fleet_env, secret_hits

pytestmark = pytest.mark.integration


def entry_job(tmp_path: Path, script: str) -> Path:
    """The example job on a RunPod pod with `script` as its entry, trained in one process (`use_ray: false`:
    what is under test is the prepare stage, not Ray Train's start-up)."""
    body = "".join(f"    {line}\n" for line in script.splitlines())
    section = f"runpod:\n  max_bid_per_gpu: 0.5\n  env:\n    TEST_ENV: happy\n  entry: |\n{body}"
    job = job_for(tmp_path, section, extra="hub_model_id: tester/tiny-entry\n")
    job.write_text(job.read_text().replace("use_ray: true", "use_ray: false"))
    return job


def run_it(home: Path, fake_runpod: str, job: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with FakeHub(home=home.parent / "hub", token=HF_TOKEN) as hub:
        env = fleet_env(
            home,
            RUNPOD_API_BASE_URL=fake_runpod,
            RUNPOD_API_KEY=API_KEY,
            HF_TOKEN=HF_TOKEN,
            HF_ENDPOINT=hub.url,
            HF_HUB_DISABLE_XET="1",
        )
        done = fleet(env, "run", str(job), "--json", timeout=420)
    assert done.stdout, done.stderr[-3000:]
    view: dict[str, Any] = json.loads(done.stdout)
    assert HF_TOKEN not in done.stdout + done.stderr
    return view, events_of(home, view["run_id"])


def test_a_multi_line_entry_runs_on_the_node_before_the_fetch(
    home: Path, fake_runpod: str, tmp_path: Path
) -> None:
    script = (
        "set -e\n"
        "# the working directory of the run: the datasets that travelled with its Ray jobs\n"
        "test -d datasets/0\n"
        'echo "the token: $HF_TOKEN"\n'
        "# sh reads TEST_ENV from the section env, and expands it itself (after the script changed it)\n"
        'if [ "$TEST_ENV" = happy ]; then\n'
        "  TEST_ENV=changed-by-the-script\n"
        "fi\n"
        'echo "entry-marker $TEST_ENV"\n'
    )
    view, evs = run_it(home, fake_runpod, entry_job(tmp_path, script))
    assert view["state"] == "SUCCEEDED", view["failure_message"]

    (ended,) = [e["data"] for e in evs if e["type"] == "prepare.entry"]
    assert (ended["status"], ended["exit_code"]) == ("SUCCEEDED", 0) and ended["seconds"] >= 0
    assert "entry-marker changed-by-the-script" in ended["output"]
    assert "Running entrypoint" not in ended["output"]  # Ray's own line repeating the script is left out
    assert "the token: <redacted>" in ended["output"] and HF_TOKEN not in ended["output"]
    # The entry, then the fetch: each submitted once, the fetch only after the entry ended.
    kinds = [(e["type"], e["data"].get("ray_job", "")) for e in evs]
    rid = view["run_id"]
    submitted = [job for kind, job in kinds if kind == "prepare.submitted"]
    assert submitted == [f"{rid}-1-entry", f"{rid}-1-fetch"]
    assert kinds.index(("prepare.entry", ended["ray_job"])) < kinds.index(("prepare.submitted", submitted[1]))

    logs = fleet(fleet_env(home), "logs", rid)
    (line,) = [ln for ln in logs.stdout.splitlines() if " prepare.entry " in ln]
    assert "status=SUCCEEDED" in line and line.endswith("output=…entry-marker changed-by-the-script")
    assert secret_hits(home, HF_TOKEN) == []


def test_an_entry_that_exits_non_zero_fails_the_run_and_nothing_else_runs(
    home: Path, fake_runpod: str, tmp_path: Path
) -> None:
    script = (
        'echo "setting up"\n'
        'echo "the token: $(printenv HF_TOKEN)" >&2\n'
        'echo "no such thing: fail-marker"\n'
        "exit 3\n"
    )
    view, evs = run_it(home, fake_runpod, entry_job(tmp_path, script))
    assert (view["state"], view["failure_reason"]) == ("FAILED", "ENTRY_FAILED")
    message = view["failure_message"]
    assert message.startswith("the entry script exited with code 3; the end of its output:\n")
    assert message.endswith("no such thing: fail-marker")
    assert "the token: <redacted>" in message and HF_TOKEN not in message

    kinds = [e["type"] for e in evs]
    (ended,) = [e["data"] for e in evs if e["type"] == "prepare.entry"]
    assert (ended["status"], ended["exit_code"]) == ("FAILED", 3)
    (failed,) = [e["data"] for e in evs if e["type"] == "run.failed"]
    assert failed["reason"] == "ENTRY_FAILED" and failed["message"].endswith("fail-marker")
    # Neither the fetch nor the training was ever submitted; the pod is gone (one_shot), the only one made.
    rid = view["run_id"]
    assert [e["data"]["ray_job"] for e in evs if e["type"] == "prepare.submitted"] == [f"{rid}-1-entry"]
    assert "train.submitted" not in kinds and "prepare.fetched" not in kinds
    assert kinds[-1] == "run.failed" and "instance.terminated" in kinds
    state = fake_state(fake_runpod)
    assert state["instances"] == [] and state["requests"]["create"] == 1
    assert secret_hits(home, HF_TOKEN) == []
