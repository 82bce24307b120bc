"""The Discord notifier against real Redis, the real discord.py and the fake Discord (no mocks).

Runs move through the real Ledger; the notifier reads `tf:events` through its own consumer group and
posts through a real `SyncWebhook`. `discord.http.Route.BASE` is process-global: a fixture points it at
the fake through monkeypatch, so it is restored after each test.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import requests
from PIL import Image

from bot.notifier import Notifier, webhook_parts
from core.settings import Settings
from providers.registry import load_fleet_secrets
from state.keys import alive_key
from state.keys import notify_sent_key as sent_key
from state.keys import notify_status_key as status_key
from tests.factories import Script
from tests.fakes import FakeDiscord
from tests.integration.fleetproc import fleet_env

CHANNEL = 223456789012345678
CANARY = "canary-secret-value-5f1e2d"
Make = Callable[..., Notifier]


@pytest.fixture
def make(
    fake_discord: FakeDiscord, redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> Iterator[Make]:
    """Build notifiers the way `fleet notify` would: from Settings and the known credentials."""
    monkeypatch.setenv("RUNPOD_API_KEY", CANARY)
    monkeypatch.setenv("FLEET_SECRETS_FILE", str(tmp_path / "missing.yml"))
    hook_id, token = fake_discord.add_webhook(CHANNEL)
    settings = Settings(
        discord_webhook_url=f"{fake_discord.url}/api/webhooks/{hook_id}/{token}",
        discord_api_base=f"{fake_discord.url}/api/v10",
    )
    sessions: list[requests.Session] = []

    def build(consumer: str = "n1") -> Notifier:
        session = requests.Session()
        sessions.append(session)
        notifier = Notifier.from_settings(settings, redis_client, load_fleet_secrets(), session)
        notifier.consumer.consumer = consumer
        notifier.block_ms, notifier.backoff_s = 20, 0.0
        return notifier

    yield build
    for session in sessions:
        session.close()


def _messages(fake_discord: FakeDiscord) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = fake_discord.state()["channels"].get(str(CHANNEL), [])
    return found


def _texts(fake_discord: FakeDiscord) -> list[str]:
    return [m["created"]["content"] for m in _messages(fake_discord) if m["created"]["content"]]


def _status(fake_discord: FakeDiscord, run_id: str) -> dict[str, Any]:
    (found,) = [
        m for m in _messages(fake_discord) if m["embeds"] and m["embeds"][0]["title"].startswith(run_id)
    ]
    return found


def _state_of(embeds: list[dict[str, Any]]) -> str:
    state: str = next(f["value"] for f in embeds[0]["fields"] if f["name"] == "State")
    return state


def _drain(notifier: Notifier) -> int:
    handled = 0
    while (n := notifier.process_once()) or notifier.last_error:
        handled += n
    return handled


def test_one_status_message_per_run_edited_in_place(
    make: Make, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    script, notifier = Script(redis_client), make()
    script.create("r1")
    script.create("r2")
    assert notifier.process_once() == 2
    script.to_training("r1")
    assert notifier.process_once() == 4
    script.steps("r1", [1, 2, 3])
    assert notifier.process_once() == 3
    script.succeed("r1")
    script.fail("r2", "CUDA out of memory")
    assert _drain(notifier) == 3

    first, second = _status(fake_discord, "r1"), _status(fake_discord, "r2")
    states = [_state_of(first["created"]["embeds"]), *(_state_of(e["embeds"]) for e in first["edits"])]
    assert states == ["QUEUED", "TRAINING", "TRAINING", "SUCCEEDED"]  # three steps in one batch: one edit
    assert first["embeds"][0]["color"] == 0x2ECC71 and second["embeds"][0]["color"] == 0xE74C3C
    fields = {f["name"]: f["value"] for f in first["embeds"][0]["fields"]}
    assert fields["W&B"] == "https://wandb.example/r1" and fields["Instance"] == "tf-r1-1 ($2.500/h)"
    assert redis_client.get(status_key("r1")) == first["id"]
    texts = _texts(fake_discord)
    assert len(texts) == 3
    r1 = [text for text in texts if "run r1" in text or "Run r1" in text]  # in order within a run
    assert r1[0] == "📈 W&B for run r1: https://wandb.example/r1"
    assert r1[1].startswith("✅ Run r1 succeeded: eval_loss 2.0 → 0.5")
    assert "❌ Run r2 failed: TRAINING_FAILED\nCUDA out of memory" in texts
    assert len(_messages(fake_discord)) == 5
    # The result carries r1's loss picture (its three steps), as a PNG; r2 reported no loss: no picture.
    pictured = {m["content"].split(":")[0]: m["attachments"] for m in _messages(fake_discord) if m["content"]}
    assert pictured["✅ Run r1 succeeded"] == ["r1-loss.png"] and pictured["❌ Run r2 failed"] == []
    # ... attached once the message was out (the message never waits for the drawing): by one edit.
    (result,) = [m for m in _messages(fake_discord) if m["content"].startswith("✅ Run r1 succeeded")]
    assert [edit["content"] for edit in result["edits"]] == [result["content"]]
    (png,) = [data for name, data in fake_discord.files.values() if name == "r1-loss.png"]
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG" and image.size == (800, 450)


def test_a_429_on_the_edit_route_holds_up_no_post(
    make: Make, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    script, notifier = Script(redis_client), make()
    script.create("r1")
    script.create("r2")
    assert notifier.process_once() == 2
    # One of the two status edits is answered 429 (wait 3 s, with Via: discord.py waits it out on the edit
    # route), while r2's failure is a message of its own, on the create route: it must not wait for that.
    fake_discord.add_faults([{"op": "edit_webhook_message", "kind": "429", "times": 1, "retry_after": 3.0}])
    script.to_training("r1")
    script.fail("r2", "late")
    seen: dict[str, Any] = {}

    def watch() -> None:
        while not seen and handled.is_alive():
            if any(t.startswith("❌ Run r2 failed") for t in _texts(fake_discord)):
                seen["edits then"] = sum(len(_status(fake_discord, r)["edits"]) for r in ("r1", "r2"))
            time.sleep(0.02)

    handled = threading.Thread(target=notifier.process_once)
    handled.start()
    watch()
    handled.join(30)
    assert seen.get("edits then", 2) <= 1  # posted while an edit still waited out its 429
    assert notifier.last_error is None
    assert [len(_status(fake_discord, r)["edits"]) for r in ("r1", "r2")] == [1, 1]


def test_restart_and_crash_before_ack_post_each_message_once(
    make: Make, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    script = Script(redis_client)
    script.create("r1")
    script.to_training("r1")
    first = make()
    assert _drain(first) == 5
    # A crash after posting but before acking: the batch is handled, never acked.
    script.succeed("r1")
    first.ack_enabled = False
    assert first.process_once() == 2
    pending = redis_client.xpending("tf:events", "notifier")["pending"]
    assert pending == 2
    # A new process under the same consumer name gets the pending entries again: no repeat is posted.
    again = make("n1")
    assert _drain(again) == 2
    assert redis_client.xpending("tf:events", "notifier")["pending"] == 0
    script.create("r3")
    script.fail("r3", "boom")
    assert _drain(make("n2")) == 2
    texts = _texts(fake_discord)
    assert [t.split(":")[0] for t in texts] == [
        "📈 W&B for run r1",
        "✅ Run r1 succeeded",
        "❌ Run r3 failed",
    ]
    assert len([m for m in _messages(fake_discord) if m["embeds"]]) == 2
    assert redis_client.exists(sent_key("r1-7"))


def test_429_with_via_is_retried_and_other_errors_redeliver(
    make: Make, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    script, notifier = Script(redis_client), make()
    script.create("r1")
    script.to_training("r1")
    fake_discord.add_faults([{"op": "execute_webhook", "kind": "429", "times": 1, "retry_after": 0.05}])
    assert notifier.process_once() == 5 and notifier.last_error is None
    script.succeed("r1")
    # discord.py retries a 5xx itself (seconds apart); a 429 without Via it raises at once, as any error.
    fake_discord.add_faults(
        [{"op": "edit_webhook_message", "kind": "429", "via": False, "retry_after": 0.05}]
    )
    assert notifier.process_once() == 0 and notifier.last_error is not None
    script.fail("r1", "late")  # after the refused batch: pending entries still come first
    fake_discord.add_faults(
        [{"op": "execute_webhook", "kind": "429", "times": 1, "via": False, "retry_after": 0.05}]
    )
    # The refused batch again: its message went out beside the failed edit, and is not posted twice.
    assert notifier.process_once() == 2 and notifier.last_error is None
    assert notifier.process_once() == 0 and notifier.last_error is not None  # the failure's post
    assert redis_client.xpending("tf:events", "notifier")["pending"] == 1
    assert _drain(notifier) == 1
    assert redis_client.xpending("tf:events", "notifier")["pending"] == 0
    texts = _texts(fake_discord)
    assert [t.split(":")[0] for t in texts] == [
        "📈 W&B for run r1",
        "✅ Run r1 succeeded",
        "❌ Run r1 failed",
    ]


def test_known_credentials_never_reach_discord(
    make: Make, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    script, notifier = Script(redis_client), make()
    script.create("r1")
    script.fail("r1", f"auth failed with key {CANARY} at step 3")
    assert _drain(notifier) == 2
    dumped = json.dumps(fake_discord.state())
    assert CANARY not in dumped
    assert "auth failed with key [redacted] at step 3" in _texts(fake_discord)[0]
    assert "[redacted]" in json.dumps(_status(fake_discord, "r1")["embeds"])


def test_settings_hide_the_webhook_and_parse_it() -> None:
    url = "https://discord.com/api/webhooks/123456789012345678/tok-en_x"
    assert Settings(discord_webhook_url=url).public()["discord_webhook_url"] == "<set>"
    assert webhook_parts(url) == (123456789012345678, "tok-en_x")


def test_fleet_notify_posts_until_stopped(
    fake_discord: FakeDiscord, redis_client: redis.Redis[str], redis_url: str, tmp_path: Any
) -> None:
    """`fleet notify` as its own process: refused without a webhook; with one, it posts the run's status
    message, and SIGTERM ends it cleanly."""
    import signal
    import subprocess
    import sys
    import time

    env = fleet_env(tmp_path / "home", REDIS_URL=redis_url)
    cmd = [sys.executable, "-m", "fleet", "notify"]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "FLEET_DISCORD_WEBHOOK_URL is not set" in refused.stderr

    hook_id, token = fake_discord.add_webhook(CHANNEL)
    env.update(
        FLEET_DISCORD_WEBHOOK_URL=f"{fake_discord.url}/api/webhooks/{hook_id}/{token}",
        FLEET_DISCORD_API_BASE=f"{fake_discord.url}/api/v10",
    )
    Script(redis_client).create("cli-run")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not any(m["embeds"] for m in _messages(fake_discord)):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no status message from `fleet notify`"
            time.sleep(0.2)
        assert _status(fake_discord, "cli-run")["embeds"][0]["title"].startswith("cli-run")
        # docker-compose's healthcheck of the notifier service: it marks itself alive while it reads.
        health = subprocess.run([*cmd[:-1], "health", "notifier"], env=env, capture_output=True, timeout=60)
        assert health.returncode == 0, health.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        if proc.stderr:
            proc.stderr.close()
    redis_client.delete(alive_key("notifier", socket.gethostname()))  # as ALIVE_TTL_S after it stopped
    health = subprocess.run([*cmd[:-1], "health", "notifier"], env=env, capture_output=True, timeout=60)
    assert health.returncode == 1 and b"no notifier on" in health.stderr
