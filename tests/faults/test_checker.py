"""The invariant checker itself can fail: each invariant, broken on purpose, is reported.

A duplicate and a leaked instance on a fake cloud, a run that never ends and one that ends otherwise than
expected, and the canaries planted in every kind of Redis value (one inside a Celery message's base64
body, as task arguments would be), in a log and in a Discord message.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import redis

from broker.app import app, configure
from core.settings import Settings
from state.stages import RunState
from tests.factories import Script
from tests.fakes import FakeDiscord, FakeRunPod, Instance
from tests.faults.canaries import CANARIES
from tests.faults.case import Case
from tests.faults.invariants import check

pytestmark = pytest.mark.faults


def test_every_invariant_broken_on_purpose_is_reported(
    redis_client: redis.Redis[str], redis_url: str, tmp_path: Path
) -> None:
    probe = Case("checker self-test", end_timeout_s=0, settle_s=0)
    with probe.stack:
        fake = probe.cloud(FakeRunPod, tmp_path / "fake", nodes="none")
        for ident in ("a", "b"):  # two live instances of one name: a duplicate, and both leaked
            fake.add_instance(Instance(ident, "tf-dup-1", "NVIDIA RTX A5000", 1, 0.27, None, {}))
        probe.watch_redis(lambda: redis_url)
        script = Script(redis_client)
        for run_id in ("never-ends", "fails"):
            script.create(run_id)
            probe.expect(run_id, RunState.SUCCEEDED)
        script.fail("fails", "on purpose")

        secrets = list(CANARIES.values())
        redis_client.set("planted:string", f"x{secrets[0]}x")
        redis_client.hset("planted:hash", "field", secrets[1])
        redis_client.sadd("planted:set", secrets[2])
        redis_client.zadd("planted:zset", {secrets[3]: 1.0})
        redis_client.xadd("planted:stream", {"event": json.dumps({"data": secrets[0]})})
        configure(Settings(home=tmp_path / "home"), redis_url)  # a real Celery message: base64 body
        app.send_task("trainfleet.provision", args=["run", secrets[1]], queue="planted-queue")
        log = tmp_path / "worker.log"
        log.write_text(f"token={secrets[2]}\n")
        probe.watch_log(log)
        discord = probe.stack.enter_context(FakeDiscord())
        probe.watch_discord(discord)
        hook, token = discord.add_webhook(1)
        _post(discord.url, hook, token, f"key {secrets[3]}")

        found = check(probe)

    assert found.duplicates == ["runpod:tf-dup-1 x2"]
    assert sorted(found.leaked) == ["runpod:tf-dup-1:a", "runpod:tf-dup-1:b"]
    assert found.not_terminal == ["never-ends: QUEUED"]
    assert found.wrong_end == ["fails: FAILED (TRAINING_FAILED: on purpose); expected SUCCEEDED"]
    where = {hit.split(" in ", 1)[1] for hit in found.secret_hits}
    planted = {f"redis[0]:planted:{kind}" for kind in ("string", "hash", "set", "zset", "stream")}
    assert planted <= where
    assert "redis[0]:planted-queue" in where  # found inside the base64 body of the queued task
    assert str(log) in where and "discord" in where


def _post(url: str, hook: int, token: str, content: str) -> None:
    request = urllib.request.Request(
        f"{url}/api/v10/webhooks/{hook}/{token}?wait=true",
        data=json.dumps({"content": content}).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()
