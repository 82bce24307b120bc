"""One Ray cluster over several Ray nodes on this machine: a head, and a node that joined it with `ray start
--address` and the head's token (`LocalHeads.join`, the building block of the fake clouds' multi-node
clusters). With one CPU on each node, the tiny job's two Ray Train workers must run on two different nodes;
each worker reads its node from Ray, and the trainer's `started` line says where every rank ran. The job is
the whole example (90 steps), so this is also the test that the example trains well with two workers."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from providers.base import jobs_api_answers
from providers.local.client import HeadMeta, LocalHeads
from tests.factories import REPO_ROOT, example_config, train_job, trainer_command
from tests.integration.fleetproc import wait_until
from trainer import progress

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def alive_nodes(head: HeadMeta, headers: dict[str, str]) -> list[str]:
    """The ids of the cluster's ALIVE nodes, from the head's State API."""
    request = urllib.request.Request(f"{head.dashboard_url}/api/v0/nodes", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as reply:
        body: dict[str, Any] = json.loads(reply.read())
    rows = body["data"]["result"]["result"]
    return sorted(row["node_id"] for row in rows if row["state"] == "ALIVE")


def test_the_example_job_trains_with_two_workers_on_two_ray_nodes(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.tiny import resolve_model

    heads = LocalHeads(tmp_path / "nodes")
    head = heads.start("head", num_cpus=1, num_gpus=0, env={})
    try:
        headers = {"Authorization": f"Bearer {heads.token('head')}"}
        wait_until(lambda: jobs_api_answers(head.dashboard_url, headers), 90, "the head's Jobs API")
        with pytest.raises(ValueError, match="not a head"):
            heads.join("nowhere", "no-such-head", num_cpus=1, num_gpus=0, env={})
        joined = heads.join("node-1", "head", num_cpus=1, num_gpus=0, env={})
        assert joined.head == "head" and joined.temp_dir != head.temp_dir
        nodes = wait_until(
            lambda: len(found := alive_nodes(head, headers)) == 2 and found,
            90,
            "the second node to join the head's cluster",
        )

        job = train_job(tmp_path, example_config())
        assert job.config.use_ray and job.config.ray_num_workers == 2
        argv, env = trainer_command(
            tmp_path,
            job,
            RAY_ADDRESS=f"127.0.0.1:{head.ports['port']}",  # join the cluster, as a Ray job's driver does
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(heads.node_dir("head") / "token"),
        )
        done = subprocess.run(
            argv,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        records = list(progress.parse(output))
        started, finished = records[0], records[-1]
        assert started["kind"] == "started" and finished["kind"] == "finished", [r["kind"] for r in records]
        # Where each rank ran, as Ray told each worker: the two nodes of the cluster, one rank on each.
        assert started["num_workers"] == 2 and started["num_nodes"] == 2, started
        assert sorted(started["nodes"]) == nodes
        kinds = [r["kind"] for r in records]
        assert kinds.count("checkpoint") == 2  # steps 40 and 80 of 90
        assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 20, 40, 60, 80, 90]
        metrics = finished["metrics"]
        assert metrics["num_workers"] == 2 and metrics["global_step"] == metrics["total_steps"] == 90
        assert metrics["eval_loss"] < 0.6 * metrics["eval_loss_first"], metrics
        assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == metrics
        assert (tmp_path / "work" / "ray").is_dir()  # Ray Train's storage stays inside the run's work_dir
    finally:
        heads.stop("node-1")
        heads.stop("head")
    left = [p.pid for name in ("node-1", "head") if (m := heads.read(name)) for p in heads.processes(m)]
    assert left == [], f"Ray processes outlived the cluster: {left}"

    base = AutoModelForCausalLM.from_pretrained(
        resolve_model(job.config.base_model, Path(job.cache_dir or ""))
    )
    model = PeftModel.from_pretrained(base, job.output_dir)
    assert any("lora_A" in name for name, _ in model.named_parameters())
    assert str(REPO_ROOT) not in (tmp_path / "out" / "README.md").read_text()
