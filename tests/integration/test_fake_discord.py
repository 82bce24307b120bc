"""The fake Discord API against the real discord.py 2.7 clients (webhooks, bot REST), with no mocks.

Each test points `discord.http.Route.BASE` at the fake through monkeypatch, because that class attribute
is process-global and every later test (and discord.py itself) must see the real value again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import discord
import discord.http
import pytest
import requests

from tests.fakes import FakeDiscord
from tests.fakes.discord import DEFAULT_TOKEN

TOKEN = DEFAULT_TOKEN
CHANNEL = 123456789012345678
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def channels(fake_discord: FakeDiscord) -> None:
    """The channels these tests post to exist (one never created is Unknown Channel: its own test)."""
    fake_discord.add_channel(CHANNEL)
    fake_discord.add_channel(CHANNEL + 1)


@pytest.fixture
def session() -> Iterator[requests.Session]:
    """A requests session for SyncWebhook, closed so no socket outlives the test."""
    with requests.Session() as s:
        yield s


def _messages(fake_discord: FakeDiscord, channel: int = CHANNEL) -> list[dict[str, object]]:
    messages: list[dict[str, object]] = fake_discord.state()["channels"].get(str(channel), [])
    return messages


def test_sync_webhook_send_edit_and_embeds(fake_discord: FakeDiscord, session: requests.Session) -> None:
    hook_id, token = fake_discord.add_webhook(CHANNEL)
    hook = discord.SyncWebhook.partial(hook_id, token, session=session)
    embed = discord.Embed(title="run 7", description="loss 0.12").add_field(name="gpu", value="H100")
    msg = hook.send("started", embed=embed, wait=True)
    assert msg.channel.id == CHANNEL
    assert msg.embeds[0].title == "run 7" and msg.embeds[0].fields[0].value == "H100"
    edited = hook.edit_message(msg.id, content="finished")
    assert edited.content == "finished" and edited.edited_at is not None
    assert hook.fetch_message(msg.id).content == "finished"

    (row,) = _messages(fake_discord)
    assert row["id"] == str(msg.id)
    assert row["created"]["content"] == "started"  # type: ignore[index]
    assert [e["content"] for e in row["edits"]] == ["finished"]  # type: ignore[attr-defined]
    assert row["embeds"][0]["fields"][0]["name"] == "gpu"  # type: ignore[index]
    assert hook.fetch().channel_id == CHANNEL


def test_async_webhook_send_and_edit(fake_discord: FakeDiscord) -> None:
    hook_id, token = fake_discord.add_webhook(CHANNEL)

    async def scenario() -> tuple[int, str]:
        async with aiohttp.ClientSession() as http:
            hook = discord.Webhook.partial(hook_id, token, session=http)
            msg = await hook.send("hello", wait=True)
            edited = await msg.edit(content="hello again")
            return msg.id, edited.content

    message_id, content = asyncio.run(scenario())
    assert content == "hello again"
    (row,) = _messages(fake_discord)
    assert row["id"] == str(message_id) and row["content"] == "hello again"


def test_bot_rest_posts_and_edits(fake_discord: FakeDiscord) -> None:
    async def scenario() -> tuple[str, str]:
        client = discord.Client(intents=discord.Intents.none())
        try:
            me = await client.http.static_login(TOKEN)
            with discord.http.handle_message_parameters(content="queued") as params:
                sent = await client.http.send_message(CHANNEL, params=params)
            with discord.http.handle_message_parameters(content="running") as params:
                await client.http.edit_message(CHANNEL, sent["id"], params=params)
            got = await client.http.get_message(CHANNEL, sent["id"])
            return me["username"], got["content"]
        finally:
            await client.close()

    assert asyncio.run(scenario()) == ("fake-bot", "running")
    (row,) = _messages(fake_discord)
    assert row["created"]["content"] == "queued"  # type: ignore[index]
    assert fake_discord.state()["requests"]["edit_message"] == 1


def test_a_channel_never_created_is_unknown_as_on_discord(fake_discord: FakeDiscord) -> None:
    """A bot whose FLEET_DISCORD_CHANNEL_ID names no channel gets Discord's 404 Unknown Channel (10003)
    for a post, a read and a thread, and nothing is stored; a webhook's channel exists."""
    nowhere = CHANNEL + 7

    async def scenario() -> list[tuple[int, int]]:
        client = discord.Client(intents=discord.Intents.none())
        seen = []
        try:
            await client.http.static_login(TOKEN)
            with discord.http.handle_message_parameters(content="queued") as params:
                calls = [
                    client.http.send_message(nowhere, params=params),
                    client.http.logs_from(nowhere, 5),
                    client.http.start_thread_without_message(
                        nowhere, name="r1", auto_archive_duration=60, type=11
                    ),
                ]
                for call in calls:
                    with pytest.raises(discord.NotFound) as refused:
                        await call
                    seen.append((refused.value.status, refused.value.code))
            return seen
        finally:
            await client.close()

    assert asyncio.run(scenario()) == [(404, 10003)] * 3
    assert str(nowhere) not in fake_discord.state()["channels"]
    fake_discord.add_webhook(nowhere + 1)
    reply = requests.post(
        f"{fake_discord.url}/api/v10/channels/{nowhere + 1}/messages",
        json={"content": "x"},
        headers={"Authorization": f"Bot {TOKEN}"},
        timeout=5,
    )
    assert reply.status_code == 200


def test_bot_wrong_token_is_refused(fake_discord: FakeDiscord) -> None:
    async def scenario() -> None:
        client = discord.Client(intents=discord.Intents.none())
        try:
            await client.http.static_login("not-the-token")
        finally:
            await client.close()

    with pytest.raises(discord.LoginFailure):
        asyncio.run(scenario())
    reply = requests.post(
        f"{fake_discord.url}/api/v10/channels/{CHANNEL}/messages", json={"content": "x"}, timeout=5
    )
    assert reply.status_code == 401 and reply.json() == {"message": "401: Unauthorized", "code": 0}


def test_webhook_wrong_token_is_refused(fake_discord: FakeDiscord, session: requests.Session) -> None:
    hook_id, _ = fake_discord.add_webhook(CHANNEL)
    hook = discord.SyncWebhook.partial(hook_id, "x" * 68, session=session)
    with pytest.raises(discord.HTTPException) as caught:
        hook.send("nope", wait=True)
    assert caught.value.status == 401
    assert _messages(fake_discord) == []


def test_429_with_via_is_retried_by_discord_py(fake_discord: FakeDiscord, session: requests.Session) -> None:
    hook_id, token = fake_discord.add_webhook(CHANNEL)
    fake_discord.add_faults([{"op": "execute_webhook", "kind": "429", "times": 1, "retry_after": 0.3}])
    msg = discord.SyncWebhook.partial(hook_id, token, session=session).send("after backoff", wait=True)
    assert fake_discord.state()["requests"]["execute_webhook"] == 2
    assert [m["id"] for m in _messages(fake_discord)] == [str(msg.id)]


def test_429_without_via_raises_at_once(fake_discord: FakeDiscord, session: requests.Session) -> None:
    """The pitfall: discord.py's webhook adapter treats a 429 without `Via` as not Discord's, and raises."""
    hook_id, token = fake_discord.add_webhook(CHANNEL)
    rules: list[dict[str, Any]] = [{"op": "*", "kind": "429", "times": 1, "retry_after": 0.3, "via": False}]
    answer = requests.post(f"{fake_discord.url}/_fake/faults", json=rules, timeout=5)
    assert answer.json() == {"queued": 1}
    with pytest.raises(discord.HTTPException) as caught:
        discord.SyncWebhook.partial(hook_id, token, session=session).send("dropped", wait=True)
    assert caught.value.status == 429
    assert fake_discord.state()["requests"]["execute_webhook"] == 1 and _messages(fake_discord) == []


def test_rate_limits_answer_headers_and_429_over_the_limit() -> None:
    """Two creates per window per channel: the third in one window is refused and counted; another channel
    has a bucket of its own; an unlimited route carries no rate-limit headers."""
    with (
        FakeDiscord(token=TOKEN, rate_limits={"create_message": (2, 5.0)}) as limited,
        requests.Session() as s,
    ):
        s.headers["Authorization"] = f"Bot {TOKEN}"
        limited.add_channel(CHANNEL)
        limited.add_channel(CHANNEL + 1)
        url = f"{limited.url}/api/v10/channels/{{}}/messages"
        answers = [s.post(url.format(CHANNEL), json={"content": str(i)}, timeout=5) for i in range(3)]
        other = s.post(url.format(CHANNEL + 1), json={"content": "elsewhere"}, timeout=5)
        me = s.get(f"{limited.url}/api/v10/users/@me", timeout=5)
        state = limited.state()
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert [a.headers["X-RateLimit-Remaining"] for a in answers] == ["1", "0", "0"]
    first, refused = answers[0], answers[2]
    assert first.headers["X-RateLimit-Limit"] == "2"
    assert first.headers["X-RateLimit-Bucket"] == "create_message"
    assert 4.9 < float(first.headers["X-RateLimit-Reset-After"]) <= 5.0
    assert refused.headers["Via"] and 0 < refused.json()["retry_after"] <= 5.0
    assert other.status_code == 200 and other.headers["X-RateLimit-Remaining"] == "1"
    assert "X-RateLimit-Limit" not in me.headers
    assert state["over_limit"] == 1 and state["windows_filled"] == 1
    assert [m["content"] for m in state["channels"][str(CHANNEL)]] == ["0", "1"]


def test_bot_client_waits_out_the_limits_and_every_nth_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """discord.py's bot client reads the headers and waits for the next window instead of going over; a
    fault rule with `every` hits every n-th request only, and discord.py retries those 429s."""
    limited = FakeDiscord(token=TOKEN, rate_limits={"create_message": (3, 0.2), "edit_message": (3, 0.2)})
    limited.add_channel(CHANNEL)
    limited.add_faults([{"op": "create_message", "kind": "429", "times": 2, "every": 4, "retry_after": 0.01}])

    async def scenario() -> None:
        client = discord.Client(intents=discord.Intents.none())
        try:
            await client.http.static_login(TOKEN)
            for i in range(10):
                with discord.http.handle_message_parameters(content=str(i)) as params:
                    await client.http.send_message(CHANNEL, params=params)
        finally:
            await client.close()

    with limited:
        monkeypatch.setattr(discord.http.Route, "BASE", f"{limited.url}/api/v10")
        asyncio.run(scenario())
        state = limited.state()
    assert [m["content"] for m in state["channels"][str(CHANNEL)]] == [str(i) for i in range(10)]
    assert state["requests"]["create_message"] == 12 and limited.faults == []  # 4th and 8th: one 429 each
    assert state["over_limit"] == 0 and state["windows_filled"] >= 3


def test_hang_carries_out_the_request_and_withholds_the_answer(fake_discord: FakeDiscord) -> None:
    fake_discord.add_faults([{"op": "create_message", "kind": "hang", "hold": 1.0}])
    url, auth = f"{fake_discord.url}/api/v10/channels/{CHANNEL}/messages", {"Authorization": f"Bot {TOKEN}"}
    with requests.Session() as s, pytest.raises(requests.ReadTimeout):
        s.post(url, json={"content": "posted unawares"}, headers=auth, timeout=0.3)
    assert fake_discord.state()["held"] == 1
    assert [m["content"] for m in _messages(fake_discord)] == ["posted unawares"]


def test_interaction_callback_and_followup_are_recorded(
    fake_discord: FakeDiscord, session: requests.Session
) -> None:
    app_id = 555555555555555555
    interaction_id, token = fake_discord.add_interaction(CHANNEL, app_id)
    body: dict[str, Any] = {"type": 4, "data": {"content": "on it", "flags": 64}}
    url = f"{fake_discord.url}/api/v10/interactions/{interaction_id}/{token}/callback"
    reply = session.post(url, params={"with_response": "1"}, json=body, timeout=5)
    assert reply.status_code == 200 and reply.json()["interaction"]["response_message_ephemeral"] is True
    followups = discord.SyncWebhook.partial(app_id, token, session=session)
    followups.send("done", wait=True)
    original = followups.edit_message("@original", content="on it (edited)")  # type: ignore[call-overload]
    assert original.content == "on it (edited)"

    record = fake_discord.state()["interactions"][str(interaction_id)]
    assert record["callbacks"] == [{"type": 4, "data": {"content": "on it", "flags": 64}}]
    assert [f["data"]["content"] for f in record["followups"]] == ["done"]
    assert session.post(url.replace(token, "wrong"), json=body, timeout=5).status_code == 401


def test_attachment_download_returns_bytes(fake_discord: FakeDiscord) -> None:
    data = b"run:\n  gpu: H100\n  steps: 10\n"
    url = fake_discord.add_attachment("run.yaml", data)
    with urllib.request.urlopen(url, timeout=5) as reply:
        assert reply.read() == data
    assert requests.get(url.replace("run.yaml", "other.yaml"), timeout=5).status_code == 404


def test_command_line_serves_until_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tests.fakes", "serve", "discord", "--token", TOKEN]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        me = requests.get(f"{url}/api/v10/users/@me", headers={"Authorization": f"Bot {TOKEN}"}, timeout=5)
        assert me.json()["bot"] is True
        assert json.loads(requests.get(f"{url}/_fake/state", timeout=5).text)["requests"] == {"get_me": 1}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0


def test_threads_from_a_message_once_and_without_one_with_a_notice(fake_discord: FakeDiscord) -> None:
    """A thread started from a message has the message's id (a second start is refused with Discord's
    code 160004); one started without a message leaves a notice (type 18) in its parent. A thread is a
    channel: messages go into it by its id."""

    async def scenario() -> tuple[int, str, str]:
        client = discord.Client(intents=discord.Intents.none())
        try:
            await client.http.static_login(TOKEN)
            with discord.http.handle_message_parameters(content="run r1") as params:
                starter = await client.http.send_message(CHANNEL, params=params)
            thread = await client.http.start_thread_with_message(
                CHANNEL, starter["id"], name="r1 · job.yaml", auto_archive_duration=10080
            )
            with pytest.raises(discord.HTTPException) as again:
                await client.http.start_thread_with_message(
                    CHANNEL, starter["id"], name="r1 · job.yaml", auto_archive_duration=10080
                )
            with pytest.raises(discord.NotFound):
                await client.http.start_thread_with_message(
                    CHANNEL, "1", name="nothing", auto_archive_duration=60
                )
            with discord.http.handle_message_parameters(content="in the thread") as params:
                await client.http.send_message(thread["id"], params=params)
            bare = await client.http.start_thread_without_message(
                CHANNEL, name="r2", auto_archive_duration=60, type=11
            )
            assert thread["id"] == starter["id"] and thread["parent_id"] == str(CHANNEL)
            return again.value.code, thread["id"], bare["id"]
        finally:
            await client.close()

    code, thread_id, bare_id = asyncio.run(scenario())
    assert code == 160004
    state = fake_discord.state()
    assert [m["content"] for m in state["channels"][thread_id]] == ["in the thread"]
    assert [(m["content"], m["type"]) for m in _messages(fake_discord)] == [("run r1", 0), ("r2", 18)]
    assert sorted(state["threads"]) == sorted([thread_id, bare_id])
    assert state["requests"]["start_thread"] == 4


def test_discord_refuses_a_message_over_its_limits_and_posts_nothing(
    fake_discord: FakeDiscord, session: requests.Session
) -> None:
    """Discord's documented limits, answered as Discord does (400, code 50035, the field named), for the
    bot's messages and a webhook's alike; bot.render's cuts keep the fleet inside them."""
    hook_id, token = fake_discord.add_webhook(CHANNEL)
    hook = discord.SyncWebhook.partial(hook_id, token, session=session)
    too_long = [
        ({"content": "x" * 2001}, "In content: Must be 2000 or fewer in length"),
        ({"embed": discord.Embed(title="t" * 257)}, "In embeds.0.title"),
        ({"embed": discord.Embed(description="d" * 4097)}, "In embeds.0.description"),
        ({"embed": _fields(26, "v")}, "In embeds.0.fields: Must be 25 or fewer"),
        ({"embed": _fields(1, "v" * 1025)}, "In embeds.0.fields.0.value"),
        ({"embeds": [_fields(25, "v" * 1000)] * 1}, "Embed size exceeds maximum size of 6000"),
    ]
    for kwargs, said in too_long:
        with pytest.raises(discord.HTTPException, match=said) as refused:
            hook.send(wait=True, **kwargs)
        assert refused.value.status == 400 and refused.value.code == 50035
    eleven = {"embeds": [{"title": "x"}] * 11}  # discord.py refuses this itself; Discord does too
    raw = session.post(f"{fake_discord.url}/api/v10/webhooks/{hook_id}/{token}", json=eleven, timeout=5)
    assert raw.status_code == 400 and raw.json()["errors"]["embeds"]["_errors"][0]["message"].startswith(
        "Must be 10 or fewer"
    )
    assert _messages(fake_discord) == []
    ok = hook.send("x" * 2000, embed=_fields(25, "v" * 200), wait=True)  # at the limits: taken
    with pytest.raises(discord.HTTPException, match="In content"):
        hook.edit_message(ok.id, content="y" * 2001)  # an edit is held to them too
    assert len(_messages(fake_discord)) == 1


def _fields(count: int, value: str) -> discord.Embed:
    embed = discord.Embed(title="run")
    for i in range(count):
        embed.add_field(name=f"f{i}", value=value)
    return embed


def test_an_interaction_is_answered_once_and_within_three_seconds(
    fake_discord: FakeDiscord, session: requests.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    interaction_id, token = fake_discord.add_interaction(CHANNEL, 555555555555555555)
    url = f"{fake_discord.url}/api/v10/interactions/{interaction_id}/{token}/callback"
    assert session.post(url, json={"type": 5}, timeout=5).status_code == 204  # deferred: answered
    again = session.post(url, json={"type": 4, "data": {"content": "late"}}, timeout=5)
    assert (again.status_code, again.json()["code"]) == (400, 40060)  # already acknowledged
    late_id, late_token = fake_discord.add_interaction(CHANNEL, 555555555555555555)
    fake_discord.born[str(late_id)] -= 3.5  # as if it arrived 3.5 s ago
    late = session.post(f"{fake_discord.url}/api/v10/interactions/{late_id}/{late_token}/callback",
                        json={"type": 5}, timeout=5)  # fmt: skip
    assert (late.status_code, late.json()["code"]) == (404, 10062)  # Unknown interaction
    record = fake_discord.state()["interactions"]
    assert [c["type"] for c in record[str(interaction_id)]["callbacks"]] == [5]
    assert record[str(late_id)]["callbacks"] == []
