"""A burst of 500 events through `fleet notify` as the bot, with 429s and a SIGKILL midway (the must-show).

Real parts only: a real redis-server, runs moved through the real Ledger (tests.factories.Script), the
real `fleet notify` process posting as the bot through discord.py's own HTTP client, and the fake Discord
with Discord-shaped rate limits switched on: 5 requests per bucket window, per channel, for creating and
for editing messages (Discord's 5 per 5 s, with time compressed 50x so the test takes seconds, yet tight
enough that the notifier fills windows and must wait). discord.py reads the fake's X-RateLimit-* headers
and waits once a bucket is used up; a request over a limit would be counted in `over_limit`. On top of
that the fake answers every n-th create and edit with an injected 429 (with Via, as Discord's are), which
discord.py must wait out and retry.

100 runs make 500 events, produced in waves across all runs once the notifier is up, so many runs are
mid-way at any moment: 30 runs succeed (9 events: W&B link and result posted), 30 fail in training (6:
W&B link and failure), 10 fail while queued (2: failure), 30 stay queued (1). 130 events deserve a
message of their own; every run has one status message.

The kill lands at the worst moment, on purpose: the fake carries out the KILL_AT-th message create (a third
of the way), then withholds its answer ("hang"), and the notifier is SIGKILLed while it waits. That message
exists, yet the dead notifier never marked it sent nor acked its entries; the restarted one reads its
pending entries again and posts it again, and only the nonce makes Discord answer with the first message
(a kill that landed anywhere else would catch a missing nonce only now and then). The second test acts
out the same for a whole batch, in process.

What is checked: each of the 130 messages is posted exactly once (and nothing else is), in its run's
thread (one per run; in the channel only the message each thread starts from); one status message per
run, whose versions (creation, then edits) never go back in the run's state order and end at the run's
final state; per run, its messages in event order; 0 requests over the limits, yet windows
filled; every injected 429 served and retried inside discord.py (no batch was refused); no pending
entries in the group. It takes about 8 s here (runs side by side, each thread its own buckets).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import discord
import discord.http
import pytest
import redis

from bot.notifier import Notifier
from bot.render import SEPARATE, separate_message
from bot.sinks import RestClient
from state.keys import EVENTS_STREAM
from state.keys import NOTIFIER_GROUP as GROUP
from state.keys import notify_sent_key as sent_key
from state.keys import notify_status_key as status_key
from state.keys import notify_thread_key as thread_key
from state.ledger import Ledger
from state.payloads import Event
from state.stages import RunState
from tests.factories import Script
from tests.fakes import FakeDiscord
from tests.integration.fleetproc import fleet_env

TOKEN = "burst-bot-token"
CHANNEL = 323456789012345678
KILL_AT = 120  # of the ~330 create requests: the one the notifier is killed in, after the fake did it
LIMITS = {"create_message": (5, 0.1), "edit_message": (5, 0.1)}  # Discord's 5 per 5 s, 50x faster
INJECTED = [
    {"op": "create_message", "kind": "hang", "every": KILL_AT, "hold": 20},  # first: it sees every create
    {"op": "create_message", "kind": "429", "times": 8, "every": 11, "retry_after": 0.05},
    {"op": "edit_message", "kind": "429", "times": 8, "every": 6, "retry_after": 0.05},
]
SUCCEED = [f"ok{i:02d}" for i in range(30)]
FAIL_TRAINING = [f"tf{i:02d}" for i in range(30)]
FAIL_QUEUED = [f"fq{i:02d}" for i in range(10)]
STAY_QUEUED = [f"q{i:02d}" for i in range(30)]
RUNS = [*SUCCEED, *FAIL_TRAINING, *FAIL_QUEUED, *STAY_QUEUED]
ORDER = list(RunState)  # QUEUED, PROVISIONING, PREPARING, TRAINING, FINALIZING, then the ends


@pytest.fixture
def fake() -> Iterator[FakeDiscord]:
    with FakeDiscord(token=TOKEN, rate_limits=LIMITS) as running:
        yield running


def produce(script: Script) -> None:
    """The 500 events, wave by wave across all runs (a run's own events stay in order)."""
    for run_id in RUNS:
        script.create(run_id)
    for run_id in [*SUCCEED, *FAIL_TRAINING]:
        script.to_training(run_id)
    for step in (1, 2):
        for run_id in SUCCEED:
            script.steps(run_id, [step])
    for a, b in zip(SUCCEED, FAIL_TRAINING, strict=True):
        script.succeed(a)
        script.fail(b, f"CUDA out of memory in {b}")
    for run_id in FAIL_QUEUED:
        script.fail(run_id, f"no capacity for {run_id}")


def stream(client: redis.Redis[str]) -> list[Event]:
    return [Event.model_validate_json(fields["event"]) for _sid, fields in client.xrange(EVENTS_STREAM)]


def threads(fake: FakeDiscord) -> dict[str, str]:
    """The runs' threads in CHANNEL: run id (the thread's name starts with it) -> thread id."""
    return {
        thread["name"].split(" · ")[0]: thread_id
        for thread_id, thread in fake.state()["threads"].items()
        if thread["parent_id"] == str(CHANNEL)
    }


def messages(fake: FakeDiscord) -> list[dict[str, Any]]:
    """What was posted for the runs: every message in CHANNEL's threads."""
    state = fake.state()
    return [
        message
        for thread_id, thread in state["threads"].items()
        if thread["parent_id"] == str(CHANNEL)
        for message in state["channels"].get(thread_id, [])
    ]


def texts(fake: FakeDiscord) -> list[str]:
    return [m["created"]["content"] for m in messages(fake) if m["created"]["content"]]


def state_of(embeds: list[dict[str, Any]]) -> RunState:
    return RunState(next(f["value"] for f in embeds[0]["fields"] if f["name"] == "State"))


def status_messages(fake: FakeDiscord) -> dict[str, list[dict[str, Any]]]:
    """Every status message, by run (the embed title starts with the run id)."""
    by_run: dict[str, list[dict[str, Any]]] = {}
    for message in messages(fake):
        if message["embeds"]:
            by_run.setdefault(message["embeds"][0]["title"].split(" · ")[0], []).append(message)
    return by_run


def caught_up(client: redis.Redis[str]) -> bool:
    """The group has read the stream's last entry and acked everything."""
    (group,) = [g for g in client.xinfo_groups(EVENTS_STREAM) if g["name"] == GROUP]
    last = client.xrevrange(EVENTS_STREAM, count=1)[0][0]
    return bool(group["pending"] == 0 and group["last-delivered-id"] == last)


def settled(client: redis.Redis[str], fake: FakeDiscord, expected: int) -> bool:
    """Everything is posted: all messages, every status at its run's final state, the group caught up."""
    if len(texts(fake)) < expected or not caught_up(client):
        return False
    finals = {run_id: Ledger(client).get_run(run_id).state for run_id in RUNS}
    shown = {run: state_of(ms[-1]["embeds"]) for run, ms in status_messages(fake).items()}
    return shown == finals


def wait_until(check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> bool:
    """Poll `check` for up to 120 s while `fleet notify` runs (about 20 s alone; a training beside it on
    two cores has made it 50); its last answer."""
    deadline = time.monotonic() + 120
    while not check() and time.monotonic() < deadline:
        assert proc.poll() is None, f"`fleet notify` exited {proc.returncode}:\n{log.read_text()}"
        time.sleep(0.25)
    return check()


def notify_env(fake: FakeDiscord, redis_url: str, tmp_path: Path) -> dict[str, str]:
    """`fleet notify` as the bot into CHANNEL on the fake, on the test's Redis."""
    fake.add_channel(CHANNEL)
    env = fleet_env(
        tmp_path / "home",
        REDIS_URL=redis_url,
        FLEET_DISCORD_BOT_TOKEN=TOKEN,
        FLEET_DISCORD_CHANNEL_ID=str(CHANNEL),
        FLEET_DISCORD_API_BASE=f"{fake.url}/api/v10",
    )
    return env


def start(env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "fleet", "notify"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)


def assert_statuses(client: redis.Redis[str], fake: FakeDiscord) -> None:
    """One status message per run; its versions move forward in state order and end at the final state."""
    by_run = status_messages(fake)
    assert sorted(by_run) == sorted(RUNS)
    assert [run for run, ms in by_run.items() if len(ms) > 1] == []
    for run_id, (message,) in by_run.items():
        versions = [message["created"], *message["edits"]]
        states = [ORDER.index(state_of(v["embeds"])) for v in versions]
        assert states == sorted(states), f"{run_id} went back: {[ORDER[s] for s in states]}"
        assert ORDER[states[-1]] == Ledger(client).get_run(run_id).state


@pytest.mark.timeout(120)
def test_burst_with_429s_and_a_kill_midway_posts_each_event_once_in_order(
    fake: FakeDiscord, redis_client: redis.Redis[str], redis_url: str, tmp_path: Path
) -> None:
    env, log_path = notify_env(fake, redis_url, tmp_path), tmp_path / "notify.log"
    fake.add_faults(INJECTED)
    with open(log_path, "wb") as log:
        first = start(env, log)
        try:
            assert wait_until(lambda: "get_me" in fake.state()["requests"], first, log_path), "no login"
            produce(Script(redis_client))
            events = stream(redis_client)
            assert len(events) == 500
            wanted = [(e.run_id, t) for e in events if e.type in SEPARATE and (t := separate_message(e))]
            assert len(wanted) == 130
            assert wait_until(lambda: fake.state()["held"] == 1, first, log_path), "no post was held"
        finally:
            first.kill()  # SIGKILL mid-post: the message exists, yet is neither marked sent nor acked
            first.wait(10)
        at_kill = len(texts(fake))
        second = start(env, log)
        try:
            # Not asserted: the checks below say what is missing or repeated.
            wait_until(lambda: settled(redis_client, fake, len(wanted)), second, log_path)
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
    assert first.returncode == -signal.SIGKILL and 0 < at_kill < len(wanted)

    posted = texts(fake)
    assert Counter(posted) == Counter(text for _run, text in wanted)  # each once, nothing else
    # One thread per run, started from one message naming it; in the channel nothing else.
    starters = [m["content"] for m in fake.state()["channels"][str(CHANNEL)]]
    assert sorted(starters) == sorted(f"{run_id} · job.yaml" for run_id in RUNS)
    by_run = threads(fake)
    assert sorted(by_run) == sorted(RUNS)
    for run_id, thread_id in by_run.items():  # each run's messages in its own thread, in event order
        own = [text for run, text in wanted if run == run_id]
        shown = [m["created"]["content"] for m in fake.state()["channels"][thread_id]]
        assert [t for t in shown if t] == own, f"{run_id}'s messages out of order or elsewhere"
    assert_statuses(redis_client, fake)
    limits = fake.state()
    assert limits["over_limit"] == 0 and limits["windows_filled"] > 0  # reached the limits, never crossed
    assert fake.faults == [], "not every injected 429 was served"
    assert "refused a batch" not in log_path.read_text()  # the 429s were retried by discord.py itself
    assert redis_client.xpending(EVENTS_STREAM, GROUP)["pending"] == 0


@contextmanager
def as_bot(
    fake: FakeDiscord, redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch, **options: Any
) -> Iterator[Notifier]:
    """A notifier posting into CHANNEL as the bot (its own REST client), in this process."""
    monkeypatch.setattr(discord.http.Route, "BASE", f"{fake.url}/api/v10")
    fake.add_channel(CHANNEL)
    rest = RestClient(TOKEN)
    try:
        yield Notifier(redis_client, rest.sink(CHANNEL), consumer="c1", block_ms=20, **options)
    finally:
        rest.close()


def test_a_crash_after_posting_as_the_bot_repeats_nothing(
    redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch posted but neither marked sent nor acked (the notifier died right after its posts): the next
    notifier handles it again, and the nonces make Discord answer each repeat with the first message."""
    script = Script(redis_client)
    script.create("r1")
    script.to_training("r1")
    script.succeed("r1")
    with FakeDiscord(token=TOKEN) as fake:
        with as_bot(fake, redis_client, monkeypatch) as first:
            first.ack_enabled = False
            assert first.process_once() == 7
        redis_client.delete(status_key("r1"), thread_key("r1"), *redis_client.keys(sent_key("*")))
        assert len(messages(fake)) == 3  # the status message, the W&B link, the result, in r1's thread
        with as_bot(fake, redis_client, monkeypatch) as again:
            assert again.process_once() == 7
        requests = fake.state()["requests"]
        assert requests["create_message"] == 8 and requests["start_thread"] == 2  # each sent again...
        assert len(messages(fake)) == 3 and len(threads(fake)) == 1  # ...and answered with the first
        assert len(fake.state()["channels"][str(CHANNEL)]) == 1  # the thread's one starting message
        assert redis_client.xpending(EVENTS_STREAM, GROUP)["pending"] == 0


def test_as_the_bot_the_result_in_the_runs_thread_gets_its_loss_picture(
    redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(redis_client)
    script.create("r1")
    script.to_training("r1")
    script.steps("r1", [1, 2, 3])
    script.succeed("r1")
    with FakeDiscord(token=TOKEN) as fake, as_bot(fake, redis_client, monkeypatch) as notifier:
        assert notifier.process_once() == 10
        (result,) = [m for m in messages(fake) if m["content"].startswith("✅ Run r1 succeeded")]
        assert result["attachments"] == ["r1-loss.png"] and len(result["edits"]) == 1
        notifier.close()
        assert notifier.painter.pid is None


def test_a_429_in_one_runs_thread_holds_up_that_run_only(
    redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the bot, each run posts in a thread of its own: a channel, so rate-limit buckets of its own. A 429
    with a 3 s Retry-After in r1's thread delays r1's failure message by those 3 s; r2's goes out at once."""
    script = Script(redis_client)
    script.create("r1")
    script.create("r2")
    with FakeDiscord(token=TOKEN) as fake:
        with as_bot(fake, redis_client, monkeypatch) as notifier:
            assert notifier.process_once() == 2
            slow = threads(fake)["r1"]
            fake.add_faults([{"op": "create_message", "kind": "429", "channel": slow, "retry_after": 3.0}])
            script.fail("r1", "boom")
            script.fail("r2", "boom")
            began = time.time()
            assert notifier.process_once() > 0 and notifier.last_error is None
        state = fake.state()
    assert fake.faults == []  # the 429 was served, in r1's thread
    after = {}
    for run_id, thread_id in threads(fake).items():
        (failed,) = [m for m in state["channels"][thread_id] if m["content"].startswith(f"❌ Run {run_id}")]
        after[run_id] = datetime.fromisoformat(failed["created"]["at"]).timestamp() - began
    assert after["r1"] >= 2.9, after  # waited out its Retry-After
    assert after["r2"] < 1.0, after  # not behind r1's wait


def test_a_deleted_thread_sends_the_runs_messages_to_the_channel(
    redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone deletes a run's thread: the next post there is refused (Unknown Channel); the run's messages,
    that one again first, then go to the channel itself, with a new status message there."""
    script = Script(redis_client)
    script.create("r1")
    with FakeDiscord(token=TOKEN) as fake:
        with as_bot(fake, redis_client, monkeypatch, backoff_s=0) as notifier:
            assert notifier.process_once() == 1
            fake.delete_channel(threads(fake)["r1"])
            script.fail("r1", "boom")
            assert notifier.process_once() == 0 and "Unknown Channel" in (notifier.last_error or "")
            assert notifier.process_once() > 0 and notifier.last_error is None
        channel = fake.state()["channels"][str(CHANNEL)]
    assert channel[0]["content"] == "r1 · job.yaml"  # the deleted thread's starting message stays
    assert channel[1]["embeds"] and state_of(channel[1]["embeds"]) == RunState.FAILED  # a new status
    assert channel[2]["content"].startswith("❌ Run r1 failed")
    assert len(channel) == 3
