"""The tiny job on the operator's own machine: a pool of one real sshd (tests/sshd.py; as root, its own user
`tfpool`) with one GPU, which this CPU stands in for (the machine says so, as the fake clouds' nodes do),
and the fake vast.ai as its own process. Three runs go to a fleet with a worker up: a `cloud:` job that
names the pool takes its free machine though vast.ai is cheaper, trains there as the pool's user in that
user's own environment and gives the machine back clean; an `ssh:` job sent while it holds the machine
waits for it (said once, not failed), then runs there too; and the same `cloud:` job sent then rents from
vast.ai instead of waiting. `fleet pools` shows who holds the machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from providers.ssh.connect import Connection
from tests.factories import light_job_file
from tests.integration.clouds import VAST_KEY, fake_state, serving
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

CLOUD = (
    "cloud:\n  gpu: rtx a5000\n  clouds: [ssh:lab, vastai]\n  cloud_type: ALL\n  pod_type: INTERRUPTABLE\n"
    "  max_bid_per_gpu: 1.0\n"
)


def _times(evs: list[dict[str, Any]]) -> dict[str, float]:
    """Each event type's first time."""
    return {e["type"]: e["time"] for e in reversed(evs)}


def _of(evs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in evs if e["type"] == kind]


def test_a_cloud_job_takes_the_free_pool_machine_an_ssh_job_waits_for_it_another_rents_meanwhile(
    home: Path, tmp_path: Path
) -> None:
    server = start_sshd(tmp_path / "sshd", extra=["SetEnv FLEET_CPU_STANDIN=1"])
    pools = tmp_path / "pools.yml"
    pools.write_text(
        "pools:\n  lab:\n    hourly_usd: 0.6\n    machines:\n"
        f"      - {{host: 127.0.0.1, port: {server.port}, user: {server.user}, key: {server.key}, gpus: 1, "
        "gpu: RTX-A5000}\n"
    )
    cloud_job = light_job_file(tmp_path / "cloud", section=CLOUD, extra="max_steps: 8\n")
    pool_job = light_job_file(
        tmp_path / "pool", section="ssh:\n  pool: lab\n  gpu_count: 0\n", extra="max_steps: 8\n"
    )
    again = cloud_job.with_name("again.yml")
    again.write_text(cloud_job.read_text())
    with serving("vastai", tmp_path / "fake-vastai", VAST_KEY) as vast:
        env = fleet_env(
            home,
            FLEET_SSH_POOLS_FILE=str(pools),
            FLEET_SSH_KNOWN_HOSTS=str(server.known_hosts),
            VAST_URL=vast,
            VAST_API_KEY=VAST_KEY,
        )
        worker = Worker(env, home / "worker.log")
        try:
            (first,) = [r["run_id"] for r in fleet_json(env, "enqueue", str(cloud_job))]

            def holders() -> list[str]:
                return [r["run_id"] for r in fleet_json(env, "pools") if r["run_id"] is not None]

            assert wait_until(holders, 120, "the cloud job to hold the pool machine", every=2) == [first]
            second, third = [r["run_id"] for r in fleet_json(env, "enqueue", str(pool_job), str(again))]
            views = [wait_for_end(env, run_id, timeout=900) for run_id in (first, second, third)]
        finally:
            worker.stop()
        rented = fake_state(vast)
    try:
        assert [v["state"] for v in views] == ["SUCCEEDED"] * 3, views
        one, two, three = (events_of(home, run_id) for run_id in (first, second, third))
        # The cloud job took the pool's machine, not vast.ai's cheaper offer; the other went to vast.ai
        (chosen,) = _of(one, "offer.chosen")
        assert (chosen["cloud"], chosen["offer"], chosen["price_per_hour"]) == (
            "ssh", f"lab/127.0.0.1:{server.port}", 0.6,
        )  # fmt: skip
        (elsewhere,) = _of(three, "offer.chosen")
        assert elsewhere["cloud"] == "vastai" and elsewhere["price_per_hour"] < 0.6
        assert (
            views[2]["provider"] == "vastai"
            and rented["instances"] == []
            and rented["requests"]["create"] == 1
        )
        # The ssh job waited for the machine, said once, and got it only once the first was done with it
        waits = [w["why"] for w in _of(two, "instance.waiting")]
        assert len(waits) == 1 and f"held by {first}" in waits[0], waits
        # (after the first's results came back: its node stopped and the machine was released after that, and
        # the second may claim it before the first's `instance.terminated` is written)
        assert _times(two)["instance.requested"] > _times(one)["finalize.pulled"]
        assert not [e for e in one + two + three if e["type"] == "run.retrying"]  # waiting is no failure
        assert not _of(three, "instance.waiting")  # a cloud job rents rather than wait

        view = views[0]
        assert view["provider"] == "ssh" and view["metrics"]["eval_loss"] < view["metrics"]["eval_loss_first"]
        # It trained on the pool machine as its user, in that user's environment (the node setup program's
        # venv in its home), never the fleet's, on a GPU machine that said it was a CPU stand-in.
        (ready,) = [e["data"]["check"] for e in one if e["type"] == "node.ready"]
        assert "/.trainfleet/venv/" in ready["executable"] and ready["cpu_standin"]
        # The results came back to the fleet; the machine's hours were priced.
        (pulled,) = _of(one, "finalize.pulled")
        assert pulled["files"] >= 4 and (Path(view["output_dir"]) / "adapter_model.safetensors").is_file()
        (succeeded,) = _of(one, "run.succeeded")
        assert 0 < succeeded["cost_usd"] < 0.6
        assert views[1]["provider"] == "ssh"
        # Given back, and clean: no claim, no node's files, no process of Ray's left as the pool's user.
        assert [r["run_id"] for r in fleet_json(env, "pools")] == [None]
        with Connection(server.machine(), server.known_hosts) as ssh:
            assert ssh.run("ls -A ~/.trainfleet/nodes").stdout.split() == []
            assert ssh.run('pgrep -u "$(id -u)" -f "[r]aylet|[g]cs_server"').stdout.split() == []
        assert workers_left(home) == []
    finally:
        server.stop()
