"""The tiny job on the operator's own machine: a pool of one real sshd (tests/sshd.py; as root, its own user
`tfpool`), two runs submitted at once to a fleet with a worker up. The first claims the machine, trains
there as the pool's user in that user's own environment and gives the machine back clean; the second waits
for the machine (said once, not failed), then runs on it too. `fleet pools` shows who holds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from providers.ssh.connect import Connection
from tests.factories import light_job_file
from tests.integration.fleetproc import (
    Worker,
    events_of,
    fleet_env,
    fleet_json,
    wait_for_end,
    wait_until,
    workers_left,
)
from tests.sshd import start_sshd

pytestmark = pytest.mark.integration


def _times(evs: list[dict[str, Any]]) -> dict[str, float]:
    """Each event type's first time."""
    return {e["type"]: e["time"] for e in reversed(evs)}


def test_two_runs_for_one_pool_machine_one_waits_then_each_trains_there_and_leaves_it_clean(
    home: Path, tmp_path: Path
) -> None:
    server = start_sshd(tmp_path / "sshd")
    pools = tmp_path / "pools.yml"
    pools.write_text(
        "pools:\n  lab:\n    hourly_usd: 0.6\n    machines:\n"
        f"      - {{host: 127.0.0.1, port: {server.port}, user: {server.user}, key: {server.key}}}\n"
    )
    env = fleet_env(home, FLEET_SSH_POOLS_FILE=str(pools), FLEET_SSH_KNOWN_HOSTS=str(server.known_hosts))
    job = light_job_file(
        tmp_path / "job", section="ssh:\n  pool: lab\n  gpu_count: 0\n", extra="max_steps: 8\n"
    )
    worker = Worker(env, home / "worker.log")
    try:
        again = job.with_name("again.yml")
        again.write_text(job.read_text())
        runs = [r["run_id"] for r in fleet_json(env, "enqueue", str(job), str(again))]

        def holders() -> list[dict[str, Any]]:
            return [r for r in fleet_json(env, "pools") if r["run_id"] is not None]

        (holder,) = wait_until(holders, 120, "a run to hold the machine", every=2)
        assert holder["pool"] == "lab" and holder["run_id"] in runs
        first, second = holder["run_id"], next(r for r in runs if r != holder["run_id"])
        views = [wait_for_end(env, run_id, timeout=900) for run_id in (first, second)]
    finally:
        worker.stop()
    try:
        assert [v["state"] for v in views] == ["SUCCEEDED", "SUCCEEDED"], views
        one, two = (events_of(home, run_id) for run_id in (first, second))
        # The second waited for the machine, said once, and got it only once the first was done with it
        waits = [e["data"]["why"] for e in two if e["type"] == "instance.waiting"]
        assert len(waits) == 1 and f"held by {first}" in waits[0], waits
        # (after the first's results came back: its node stopped and the machine was released after that, and
        # the second may claim it before the first's `instance.terminated` is written)
        assert _times(two)["instance.requested"] > _times(one)["finalize.pulled"]
        assert not [e for e in one + two if e["type"] == "run.retrying"]  # waiting is no failure

        view = views[0]
        assert view["provider"] == "ssh" and view["metrics"]["eval_loss"] < view["metrics"]["eval_loss_first"]
        # It trained on the pool machine as its user, in that user's environment (the node setup program's
        # venv in its home), never the fleet's.
        (ready,) = [e["data"]["check"] for e in one if e["type"] == "node.ready"]
        assert "/.trainfleet/venv/" in ready["executable"]
        # The results came back to the fleet; the machine's hours were priced.
        (pulled,) = [e["data"] for e in one if e["type"] == "finalize.pulled"]
        assert pulled["files"] >= 4 and (Path(view["output_dir"]) / "adapter_model.safetensors").is_file()
        (succeeded,) = [e["data"] for e in one if e["type"] == "run.succeeded"]
        assert 0 < succeeded["cost_usd"] < 0.6
        # Given back, and clean: no claim, no node's files, no process of Ray's left as the pool's user.
        assert [r["run_id"] for r in fleet_json(env, "pools")] == [None]
        with Connection(server.machine(), server.known_hosts) as ssh:
            assert ssh.run("ls -A ~/.trainfleet/nodes").stdout.split() == []
            assert ssh.run('pgrep -u "$(id -u)" -f "[r]aylet|[g]cs_server"').stdout.split() == []
        assert workers_left(home) == []
    finally:
        server.stop()
