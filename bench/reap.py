"""What an idle node costs before the reaper ends it: detection latency and dollars, at $2/h.

A running fleet (`fleet up`: a real Celery worker and beat, the reaper every FLEET_REAP_INTERVAL_S, 30 s as
by default) watches the fake RunPod. Pods are left idle as a finished `one_shot: false` run leaves its node
(the run SUCCEEDED, its pod still up), with `stop_after: 60`, the shortest a job may ask for. Their runs
end at staggered moments, so the samples fall at different phases of the reaper's clock. For each pod:

- idle: from the run's end to the moment the provider stops listing the pod (sampled every 0.1 s);
- late: how long after its stop_after deadline that was (the promise: under 60 s);
- dollars: the idle time priced at $2/h (a typical A100 spot price; the fake's own price is lower).

    .venv/bin/python bench/reap.py [--pods 4] [--stagger 11] [--stop-after 60]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from broker.ledger import Ledger  # noqa: E402
from broker.models import Instance, InstanceState, RunState  # noqa: E402
from jobs.sections.runpod import RunPodSection  # noqa: E402
from providers.base import LaunchRequest, ProviderContext  # noqa: E402
from providers.runpod.provider import RunPodProvider  # noqa: E402
from service.embedded import ensure_redis, stop_redis  # noqa: E402
from tests.factories import ledger_run  # noqa: E402
from tests.fakes.runpod import FakeRunPod  # noqa: E402

KEY = "bench-key"
RATE = 2.0  # $/h


def idle_pod(ledger: Ledger, provider: RunPodProvider, name: str, section: RunPodSection) -> None:
    """A pod left up by a run that just SUCCEEDED with one_shot: false."""
    pod = provider.launch(LaunchRequest(name, name, section))
    ledger.put_instance(
        Instance(
            name=name,
            provider="runpod",
            run_id=name,
            state=InstanceState.RUNNING,
            provider_id=pod.provider_id,
        )
    )
    ledger.create_run(ledger_run(name, section, RunState.SUCCEEDED, instance=name), [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--stagger", type=float, default=11.0, help="seconds between two runs' ends")
    parser.add_argument("--stop-after", type=int, default=60)
    parser.add_argument("--reap-interval", type=float, default=30.0)
    args = parser.parse_args()
    import redis

    section = RunPodSection(gpu="NVIDIA RTX A5000", one_shot=False, stop_after=args.stop_after)
    with (
        tempfile.TemporaryDirectory(prefix="bench-reap-") as tmp,
        FakeRunPod(api_key=KEY, nodes="none") as fake,
    ):
        home = Path(tmp) / "fleet"
        home.mkdir()
        (home / "none.yml").write_text("{}\n")
        url = ensure_redis(home)
        client: redis.Redis[str] = redis.Redis.from_url(url, decode_responses=True)
        ledger = Ledger(client)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_"))}
        env.update(
            FLEET_HOME=str(home), FLEET_SETTINGS_FILE=str(home / "none.yml"),
            FLEET_SECRETS_FILE=str(home / "no-secrets.yml"), RUNPOD_API_KEY=KEY, RUNPOD_API_BASE_URL=fake.url,
            FLEET_REAP_INTERVAL_S=str(args.reap_interval), FLEET_ORPHAN_GRACE_S="0", PYTHONUNBUFFERED="1",
        )  # fmt: skip
        provider = RunPodProvider(ProviderContext(home, urls={"runpod": fake.url}, credentials=_key()))
        log = (home / "worker.log").open("ab")
        worker = subprocess.Popen(
            [sys.executable, "-m", "fleet", "up"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            time.sleep(5)  # the worker and beat start; beat's first reap comes one interval later
            ended: dict[str, float] = {}
            for i in range(args.pods):
                name = f"tf-idle{i}-1"
                idle_pod(ledger, provider, name, section)
                ended[name] = ledger.get_run(name).updated_at
                time.sleep(args.stagger)
            gone: dict[str, float] = {}
            deadline = time.time() + args.stop_after + 4 * args.reap_interval + 60
            while len(gone) < len(ended) and time.time() < deadline:
                listed = {str(i["name"]) for i in fake.state()["instances"]}
                for name in ended:
                    if name not in listed and name not in gone:
                        gone[name] = time.time()
                time.sleep(0.1)
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
            log.close()
            stop_redis(home)
            if len(gone) < len(ended):  # say why, before the directory goes
                print((home / "worker.log").read_text()[-3000:], file=sys.stderr)
    samples: list[dict[str, Any]] = []
    for name, end in ended.items():
        idle = gone.get(name, float("nan")) - end
        late = idle - args.stop_after
        samples.append(
            {
                "pod": name,
                "idle_s": round(idle, 1),
                "late_s": round(late, 1),
                "usd": round(idle * RATE / 3600, 4),
            }
        )
        print(
            f"{name}: idle {idle:6.1f} s, {late:5.1f} s past stop_after, "
            f"${idle * RATE / 3600:.4f} at ${RATE:.0f}/h"
        )
    lates = [s["late_s"] for s in samples]
    dollars = [s["usd"] for s in samples]
    summary = {
        "pods": len(samples),
        "reaped": len(gone),
        "stop_after_s": args.stop_after,
        "reap_interval_s": args.reap_interval,
        "late_s_mean": round(statistics.fmean(lates), 1),
        "late_s_max": max(lates),
        "idle_usd_at_2_per_h_mean": round(statistics.fmean(dollars), 4),
        "idle_usd_at_2_per_h_max": max(dollars),
        "within_stop_after_plus_60": len(gone) == len(ended) and max(lates) <= 60,
    }
    print(json.dumps(summary))


def _key() -> dict[str, Any]:
    from pydantic import SecretStr

    return {"RUNPOD_API_KEY": SecretStr(KEY)}


if __name__ == "__main__":
    main()
