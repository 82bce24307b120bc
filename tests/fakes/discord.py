"""A fake of Discord's REST API (v10), good enough for discord.py 2.7's own HTTP clients, unmodified.

Point discord.py at it with `discord.http.Route.BASE = f"{fake.url}/api/v10"`: the bot's `HTTPClient`
and both webhook adapters build every URL from that class attribute (it is process-global, so restore it
after a test). Webhooks cannot come from `SyncWebhook.from_url(fake_url)`: `from_url` only accepts
`discord(app).com/api/webhooks/<17-20 digits>/<60+ chars>`. Build them with
`discord.SyncWebhook.partial(id, token)` or `discord.Webhook.partial(id, token, session=...)` instead,
using the (id, token) that `fake.add_webhook(channel_id)` returns; their requests then go to Route.BASE.

Served (under /api/v10): GET users/@me; GET oauth2/applications/@me; PUT applications/{app}/commands and
applications/{app}/guilds/{g}/commands (the registered slash commands, kept per scope); POST/GET
channels/{c}/messages (a message with `enforce_nonce` and a nonce seen in that channel returns the earlier
message, as Discord does); POST channels/{c}/threads and channels/{c}/messages/{m}/threads (a public thread:
a channel of its own, with its own rate-limit buckets, whose id is the starting message's when there is one;
one started without a message leaves Discord's "thread created" notice, type 18, in its parent); GET/PATCH
channels/{c}/messages/{m}; GET/POST webhooks/{id}/{token} (`?wait=true` returns the message);
GET/PATCH webhooks/{id}/{token}/messages/{m|@original}; POST interactions/{id}/{token}/callback. Each
interaction's followups record `ephemeral` as Discord decides it (the first one after a deferral is as
private as the deferral, whatever its own flags); a callback's flags are in its recorded data.
GET gateway/bot, and the gateway itself: a WebSocket on the fake's port (tests.fakes.discord_gateway, for
discord.py's client to connect, identify, become ready and keep its heartbeat; no events).
Outside the API: GET /attachments/{id}/{filename} (bytes from `add_attachment`, or files sent with a
message). Bot routes need `Authorization: Bot <token>`, webhook routes the webhook's (or interaction's)
token in the path; otherwise 401 in Discord's error shape.

Operations (request counts, fault rules): get_me, get_application, get_gateway, put_commands, create_message,
list_messages, get_message, edit_message, start_thread, get_webhook, execute_webhook, get_webhook_message,
edit_webhook_message, interaction_callback, attachment, other. Fault kinds: "429" (Discord's body plus
Retry-After, X-RateLimit-* and, unless the rule says `"via": false`, `Via: 1.1 google`; discord.py's webhook
adapters retry a 429 only when Via is present), "500", and "hang" (the request is carried out, then its
answer is withheld for `hold` seconds and the connection closed: a client killed meanwhile has posted
without knowing; `state()["held"]` counts them). A rule answers the next `times` requests of its
operation, or with `"every": n` every n-th one (the others pass it by); with `"channel": id`, only those
in that channel or thread (or to that webhook). Control: GET /_fake/state, POST
/_fake/faults (a list).

Rate limits (tests/fakes/discord_limits.py), off unless given: `FakeDiscord(rate_limits={"create_message":
(5, 0.1)})` allows 5 requests per 0.1 s per bucket (an operation in one channel, or one webhook). Every
answer on a limited route then carries X-RateLimit-* headers, as Discord's do, and a request over the limit
gets a 429 (with Via) that `state()["over_limit"]` counts apart from the injected faults;
`state()["windows_filled"]` counts the bucket windows a client used up to the limit.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import quote

from tests.fakes.discord_gateway import GatewayState, gateway_bot
from tests.fakes.discord_gateway import serve as gateway_serve
from tests.fakes.discord_handlers import DiscordHandlers
from tests.fakes.discord_limits import Limits, RateLimits
from tests.fakes.discord_rules import INTERACTION_ANSWER_S, MESSAGE_OPERATIONS, form_error
from tests.fakes.discord_wire import (
    APPLICATION_ID,
    DiscordServer,
    DRequest,
    Hook,
    Message,
    Reply,
    error_reply,
    rate_limited,
)
from tests.fakes.faults import FaultRule
from tests.fakes.serving import Served

DEFAULT_TOKEN = "fake-bot-token"
FAULT_KINDS = frozenset({"429", "500", "hang"})
DISCORD_EPOCH_MS = 1420070400000
_API = ("api", "v10")


@dataclass
class DiscordFault(FaultRule):
    """Discord's scripted misbehaviours: `via` (a 429's Via header), `hold` (how long a "hang" withholds its
    answer), `every` (only every n-th request of the operation is hit), `channel` (only requests in that
    channel, or thread, or to that webhook: the bucket's major parameter)."""

    via: bool = True
    hold: float = 5.0
    every: int = 1
    channel: str | None = None
    seen: int = field(default=0, init=False)  # requests of the operation this rule has seen (for `every`)

    KINDS: ClassVar[frozenset[str]] = FAULT_KINDS

    def __post_init__(self) -> None:
        self.every = max(1, self.every)


class FakeDiscord(Served, DiscordHandlers):
    """The fake Discord REST API. Use as a context manager, or `start()` / `stop()`."""

    def __init__(self, token: str = DEFAULT_TOKEN, port: int = 0, rate_limits: Limits | None = None) -> None:
        self.token = token
        self.port = port
        self.lock = threading.RLock()
        self.requests: dict[str, int] = {}
        self.faults: list[DiscordFault] = []
        self.limits = RateLimits(rate_limits)
        self.held = 0  # requests handled whose answer a "hang" fault withheld
        self.served: list[dict[str, Any]] = []  # each fault served: op, kind, channel (major), at (time.time)
        self.channels: dict[str, list[Message]] = {}
        self.threads: dict[str, dict[str, Any]] = {}  # thread id -> Discord's channel object of the thread
        self.deleted: set[str] = set()  # channels (threads) deleted: Unknown Channel from then on
        self.known: set[str] = set()  # channels that exist (add_channel, a webhook's, an interaction's)
        self.hooks: dict[str, Hook] = {}  # keyed by token: interactions share their app id
        self.interactions: dict[str, dict[str, Any]] = {}
        self.born: dict[str, float] = {}  # interaction id -> when it was created (monotonic)
        self.files: dict[str, tuple[str, bytes]] = {}
        self.commands: dict[str, list[dict[str, Any]]] = {}  # scope ("global" or a guild id) -> commands
        self.gateway = GatewayState()
        self._ids = itertools.count(1)

    # -- lifecycle (start, url, stop, `with`: tests.fakes.serving); discord.py wants
    # `Route.BASE = f"{url}/api/v10"` -------------------------------------------------------------
    def new_server(self) -> DiscordServer:
        return DiscordServer(self, self.port)

    def after_stop(self) -> None:
        self.gateway.close_all()

    # -- the gateway (tests.fakes.discord_gateway) -----------------------------------------------
    def serve_gateway(self, headers: Any, reader: Any, writer: Any, sock: Any) -> None:
        ready = {
            "user": self._bot_user(),
            "guilds": [],
            "resume_gateway_url": self.url.replace("http://", "ws://"),
            "application": {"id": APPLICATION_ID, "flags": 0},
        }
        lowered = {k.lower(): v for k, v in headers.items()}
        gateway_serve(lowered, reader, writer, sock, self.gateway, self.token, ready)

    def close_gateway(self) -> None:
        """Drop the bot's gateway sessions and refuse new ones (until `open_gateway`)."""
        self.gateway.close_all()

    def open_gateway(self) -> None:
        with self.gateway.lock:
            self.gateway.refusing = False

    # -- knobs for in-process tests (some also behind /_fake/...) ----------------------------------
    def snowflake(self) -> str:
        """A fresh, increasing snowflake whose timestamp is now (discord.py derives created_at from it)."""
        ms = int(time.time() * 1000) - DISCORD_EPOCH_MS
        return str((ms << 22) | (next(self._ids) & 0x3FFFFF))

    def add_channel(self, channel_id: int | str) -> None:
        """A text channel the bot can see. A channel never added (nor made by a webhook, an interaction or
        a thread) is answered 404 Unknown Channel, as Discord answers an id that names nothing."""
        with self.lock:
            self.known.add(str(channel_id))

    def add_webhook(self, channel_id: int | str, name: str = "fake-hook") -> tuple[int, str]:
        """Create a webhook posting into `channel_id` (which then exists); returns (id, token) for
        `SyncWebhook.partial`."""
        hook = Hook(self.snowflake(), secrets.token_urlsafe(48), str(channel_id))
        with self.lock:
            self.known.add(hook.channel_id)
            self.hooks[hook.token] = hook
        return int(hook.id), hook.token

    def add_interaction(self, channel_id: int | str, application_id: int | str) -> tuple[int, str]:
        """Register an interaction (as if a slash command arrived); returns (interaction id, token)."""
        iid, token = self.snowflake(), secrets.token_urlsafe(48)
        with self.lock:
            self.known.add(str(channel_id))
            self.hooks[token] = Hook(str(application_id), token, str(channel_id), interaction_id=iid)
            self.interactions[iid] = {"channel_id": str(channel_id), "callbacks": [], "followups": []}
            self.born[iid] = time.monotonic()  # answered within INTERACTION_ANSWER_S of this, or unknown
        return int(iid), token

    def delete_channel(self, channel_id: str) -> None:
        """Delete a channel or thread, as a moderator might: its messages go with it, and requests to it
        are answered 404 Unknown Channel."""
        with self.lock:
            self.deleted.add(str(channel_id))
            self.channels.pop(str(channel_id), None)
            self.threads.pop(str(channel_id), None)

    def add_attachment(self, filename: str, data: bytes) -> str:
        """Serve `data` at a CDN-like URL on the fake; returns that URL."""
        aid = self.snowflake()
        with self.lock:
            self.files[aid] = (filename, data)
        return f"{self.url}/attachments/{aid}/{quote(filename)}"

    def add_faults(self, rules: list[dict[str, Any]]) -> None:
        """Queue fault rules; they are consumed in order."""
        parsed = [DiscordFault.from_json(rule) for rule in rules]
        with self.lock:
            self.faults.extend(parsed)

    def state(self) -> dict[str, Any]:
        """Messages per channel in order (with edit history), interactions, request counts per operation,
        how many requests came over a rate limit, how many rate-limit windows were used up, how many
        answers a "hang" fault withheld and each fault served (op, kind, channel, at)."""
        with self.lock:
            snapshot: dict[str, Any] = json.loads(
                json.dumps(
                    {
                        "channels": {c: [m.public() for m in ms] for c, ms in self.channels.items()},
                        "threads": self.threads,
                        "interactions": self.interactions,
                        "commands": self.commands,
                        "requests": dict(self.requests),
                        "over_limit": self.limits.over_limit,
                        "windows_filled": self.limits.windows_filled,
                        "held": self.held,
                        "faults_served": self.served,
                        "gateway": self.gateway.public(),
                    }
                )
            )
        return snapshot  # a deep copy: callers may keep it while requests go on

    # -- dispatch ----------------------------------------------------------------------------------
    def dispatch(self, request: DRequest) -> Reply | None:
        """Control endpoints, then routing, counting, faults, auth, rate limits and the handler. None: close
        the connection without an answer."""
        seg = request.segments
        if seg[:1] == ["_fake"]:
            return self._control(request)
        op, handler, authorized = self._route(request)
        with self.lock:
            self.requests[op] = self.requests.get(op, 0) + 1
        # The bucket's major parameter: the channel, webhook or interaction id after /api/v10/<kind>/.
        major = seg[3] if len(seg) > 3 else ""
        fault = self._take_fault(op, major)
        if fault is not None and fault.kind != "hang":
            return self._fault_reply(fault, op)
        if not authorized:
            return error_reply(401, "401: Unauthorized")
        verdict = self.limits.take(op, major)
        if verdict is not None and not verdict.allowed:
            return rate_limited(verdict.retry_after, verdict.headers, via=True)
        try:
            reply = self._refused(op, request) or handler(request)
        except (ValueError, KeyError, TypeError) as exc:
            reply = Reply(400, {"message": f"400: Bad Request ({exc})", "code": 50035})
        if verdict is not None:
            reply.headers.update(verdict.headers)
        if fault is not None:  # "hang": done, yet the client is kept waiting for an answer that never comes
            self._withhold(fault)
            return None
        return reply

    def _refused(self, op: str, request: DRequest) -> Reply | None:
        """What Discord refuses before doing anything (tests.fakes.discord_rules): a message over its
        limits, an interaction answered twice or more than 3 s after it was created."""
        if op not in MESSAGE_OPERATIONS:
            return None
        data, _ = request.payload()
        if op == "interaction_callback":
            hook = self.hooks.get(request.segments[4])
            if hook is not None and hook.interaction_id is not None:
                with self.lock:
                    answered = bool(self.interactions[hook.interaction_id]["callbacks"])
                    age = time.monotonic() - self.born.get(hook.interaction_id, time.monotonic())
                if answered:
                    return error_reply(400, "Interaction has already been acknowledged.", 40060)
                if age > INTERACTION_ANSWER_S:
                    return error_reply(404, "Unknown interaction", 10062)
            data = dict(data.get("data") or {})
        body = form_error(data)
        return None if body is None else Reply(400, body)

    def _control(self, request: DRequest) -> Reply:
        path = "/".join(request.segments)
        if path == "_fake/state" and request.method == "GET":
            return Reply(200, self.state())
        if path == "_fake/faults" and request.method == "POST":
            try:
                self.add_faults(list(json.loads(request.body or b"[]")))
            except (ValueError, KeyError, TypeError) as exc:
                return Reply(400, {"error": str(exc)})
            return Reply(200, {"queued": len(self.faults)})
        return Reply(404, {"error": "no such control endpoint"})

    def _take_fault(self, op: str, major: str) -> DiscordFault | None:
        with self.lock:
            for fault in self.faults:
                if fault.op in (op, "*") and fault.channel in (None, major):
                    fault.seen += 1
                    if fault.seen % fault.every:
                        continue
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    self.served.append({"op": op, "kind": fault.kind, "channel": major, "at": time.time()})
                    return fault
        return None

    def _withhold(self, fault: DiscordFault) -> None:
        """Count a withheld answer, then keep the connection waiting `hold` seconds (a client that dies
        meanwhile never learns that its request was carried out)."""
        with self.lock:
            self.held += 1
        time.sleep(fault.hold)

    def _fault_reply(self, fault: DiscordFault, op: str) -> Reply:
        if fault.kind == "500":
            return error_reply(500, "500: Internal Server Error")
        headers = {
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": f"{time.time() + fault.retry_after:.3f}",
            "X-RateLimit-Reset-After": f"{fault.retry_after:g}",
            "X-RateLimit-Bucket": op,
        }
        return rate_limited(fault.retry_after, headers, via=fault.via)

    def _route(self, r: DRequest) -> tuple[str, Callable[[DRequest], Reply], bool]:
        """(operation, handler, whether the credentials are right) for a request."""
        seg, m = r.segments, r.method
        if len(seg) == 3 and seg[0] == "attachments" and m == "GET":
            return "attachment", self._attachment, True
        if tuple(seg[:2]) != _API:
            return "other", lambda _: error_reply(404, "404: Not Found"), True
        rest = seg[2:]
        bot = r.headers.get("authorization") == f"Bot {self.token}"
        if rest == ["users", "@me"] and m == "GET":
            return "get_me", lambda _: Reply(200, self._bot_user()), bot
        if rest == ["gateway", "bot"] and m == "GET":
            return "get_gateway", lambda _: Reply(200, gateway_bot(int(self.url.rsplit(":", 1)[1]))), bot
        if rest == ["oauth2", "applications", "@me"] and m == "GET":
            return "get_application", lambda _: Reply(200, self._application()), bot
        if rest[:1] == ["applications"] and rest[-1] == "commands" and len(rest) in (3, 5) and m == "PUT":
            return "put_commands", self._put_commands, bot and rest[1] == APPLICATION_ID
        if rest[:1] == ["channels"] and rest[-1] == "threads" and len(rest) in (3, 5) and m == "POST":
            ok = bot and (len(rest) == 3 or rest[2] == "messages")
            return "start_thread", self._existing(self._start_thread), ok
        if len(rest) in (3, 4) and rest[0] == "channels" and rest[2] == "messages":
            if len(rest) == 3:
                return (
                    ("create_message", self._existing(self._create), bot)
                    if m == "POST"
                    else ("list_messages", self._existing(self._list), bot)
                )
            if m == "PATCH":
                return "edit_message", self._existing(self._edit), bot
            return "get_message", self._existing(self._get), bot
        if len(rest) == 4 and rest[0] == "interactions" and rest[3] == "callback" and m == "POST":
            hook = self.hooks.get(rest[2])
            ok = hook is not None and hook.interaction_id == rest[1]
            return "interaction_callback", self._callback, ok
        if len(rest) in (3, 5) and rest[0] == "webhooks":
            hook = self.hooks.get(rest[2])
            ok = hook is not None and hook.id == rest[1]
            if len(rest) == 3:
                return (
                    ("execute_webhook", self._execute, ok) if m == "POST" else ("get_webhook", self._info, ok)
                )
            if rest[3] == "messages":
                return (
                    ("edit_webhook_message", self._edit, ok)
                    if m == "PATCH"
                    else ("get_webhook_message", self._get, ok)
                )
        return "other", lambda _: error_reply(404, "404: Not Found"), True

    def _existing(self, handler: Callable[[DRequest], Reply]) -> Callable[[DRequest], Reply]:
        """`handler` for a request to /channels/{id}/..., when that channel (or thread) exists."""

        def in_channel(r: DRequest) -> Reply:
            channel_id = r.segments[3]
            with self.lock:
                exists = channel_id not in self.deleted and (
                    channel_id in self.known or channel_id in self.threads
                )
            return handler(r) if exists else error_reply(404, "Unknown Channel", 10003)

        return in_channel
