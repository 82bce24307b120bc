"""Provisioning latency: from submit to "node ready" on each provider, and how much of it is ours.

For each provider (local, and the RunPod and vast.ai fakes, whose nodes are real local Ray heads), and for
a two-pod RunPod cluster, a job is enqueued with a running fleet and timed until its `instance.ready`
event (for the cluster: once the worker pod's Ray node joined the head's); the run is then cancelled.
Each run splits in two: submit -> `instance.requested` (the (last) create call has returned: the CLI,
the queue, the worker, the offer search and the vendor API: ours) and `instance.requested` ->
`instance.ready` (the node boots its Ray head until the Jobs API answers with the token, and a cluster's
worker node joins it: the fake's own start-up, plus at most one poll interval of ours,
FLEET_POLL_INTERVAL_S = 0.25 here). Providers alternate within each round.

    .venv/bin/python bench/provision.py [--repeats 3]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from service.embedded import stop_redis  # noqa: E402

EXAMPLE = REPO / "configs/examples/tiny-lora.yml"
SECTIONS = {
    "local": "local:\n  num_cpus: 1\n",
    "runpod": "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n",
    "vastai": "vastai:\n  gpu: RTX A5000\n  cloud_type: ALL\n  max_bid_per_gpu: 0.5\n",
    # Two pods as one Ray cluster: ready once the worker pod's node has joined the head's.
    "runpod-2": "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  num_nodes: 2\n"
    "  network_volume_id: vol-bench\n",
}
KEY = "bench-key"


def serve_fake(vendor: str, home: Path) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "tests.fakes", "serve", vendor, "--nodes", "ray", "--home", str(home)]
    proc = subprocess.Popen(
        [*argv, "--api-key", KEY], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def events(client: redis.Redis[str], run_id: str) -> list[dict[str, Any]]:
    return [json.loads(f["event"]) for _sid, f in client.xrange(f"tf:events:{run_id}")]


def time_to_ready(env: dict[str, str], job: Path, client: redis.Redis[str]) -> tuple[float, float]:
    """(submit -> instance.requested, submit -> instance.ready) in seconds."""
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "fleet", "enqueue", str(job), "--json"], env=env, cwd=REPO,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    run_id = json.loads(done.stdout)[0]["run_id"]
    while True:
        ready = [e for e in events(client, run_id) if e["type"] in ("instance.ready", "run.failed")]
        if ready:
            break
        time.sleep(0.05)
    if ready[0]["type"] != "instance.ready":
        raise SystemExit(f"{job.name}: the run failed: {ready[0]['data']}")
    # The last create call's event (a cluster's last node).
    requested = [e for e in events(client, run_id) if e["type"] == "instance.requested"][-1]
    subprocess.run(
        [sys.executable, "-m", "fleet", "cancel", run_id], env=env, cwd=REPO, capture_output=True, check=True
    )
    return float(requested["time"]) - start, float(ready[0]["time"]) - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-provision-"))
    home = work / "home"
    (work / "data").symlink_to(EXAMPLE.parent / "data")
    (work / "none.yml").write_text("{}\n")
    fakes = {v: serve_fake(v, work / f"fake-{v}") for v in ("runpod", "vastai")}
    volume = json.dumps({"id": "vol-bench"}).encode()
    urllib.request.urlopen(f"{fakes['runpod'][1]}/_fake/network-volumes", data=volume, timeout=10).close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_")) and k != "REDIS_URL"}
    env.update(FLEET_HOME=str(home), FLEET_SETTINGS_FILE=str(work / "none.yml"))
    env.update(FLEET_SECRETS_FILE=str(work / "no.yml"), FLEET_POLL_INTERVAL_S="0.25")
    env.update(RUNPOD_API_BASE_URL=fakes["runpod"][1], VAST_URL=fakes["vastai"][1])
    env.update(RUNPOD_API_KEY=KEY, VAST_API_KEY=KEY)
    worker = subprocess.Popen(
        [sys.executable, "-m", "fleet", "up"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        subprocess.run(
            [sys.executable, "-m", "fleet", "status"], env=env, cwd=REPO, capture_output=True, check=True
        )
        client: redis.Redis[str] = redis.Redis.from_url(
            (home / "redis/url").read_text(), decode_responses=True
        )
        while not list(client.scan_iter("tf:worker:*")):
            time.sleep(0.2)
        jobs = {}
        for provider, section in SECTIONS.items():
            jobs[provider] = work / f"{provider}.yml"
            jobs[provider].write_text(EXAMPLE.read_text().replace("local:\n  one_shot: true\n", section))
        ours: dict[str, list[float]] = {p: [] for p in SECTIONS}
        total: dict[str, list[float]] = {p: [] for p in SECTIONS}
        for i in range(args.repeats):  # interleaved, so the machine's drift hits every provider alike
            for provider, job in jobs.items():
                requested, ready = time_to_ready(env, job, client)
                ours[provider].append(requested)
                total[provider].append(ready)
            line = ", ".join(f"{p} {total[p][-1]:.2f} s (ours {ours[p][-1]:.2f} s)" for p in SECTIONS)
            print(f"round {i + 1}: submit to ready: {line}", flush=True)
    finally:
        worker.terminate()
        worker.wait(60)
        for proc, _url in fakes.values():
            proc.terminate()
            proc.wait(60)
        stop_redis(home)
    result: dict[str, Any] = {"repeats": args.repeats, "poll_interval_s": 0.25}
    for provider in SECTIONS:
        t, o = statistics.median(total[provider]), statistics.median(ours[provider])
        result[provider] = {
            "submit_to_ready_s": round(t, 3),
            "ours_s": round(o, 3),
            "node_boot_s": round(t - o, 3),
            "each_submit_to_ready_s": [round(v, 3) for v in total[provider]],
        }
        print(f"{provider}: submit to ready {t:.2f} s; ours {o:.2f} s; node boot {t - o:.2f} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
