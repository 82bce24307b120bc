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

import email.parser
import email.policy
import itertools
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.fakes.discord_gateway import GatewayState, gateway_bot
from tests.fakes.discord_gateway import serve as gateway_serve
from tests.fakes.discord_limits import Limits, RateLimits
from tests.fakes.discord_rules import INTERACTION_ANSWER_S, MESSAGE_OPERATIONS, form_error
from tests.fakes.faults import FaultRule
from tests.fakes.serving import Served

DEFAULT_TOKEN = "fake-bot-token"
FAULT_KINDS = frozenset({"429", "500", "hang"})
DISCORD_EPOCH_MS = 1420070400000
BOT_USER_ID = "100000000000000001"
APPLICATION_ID = "100000000000000002"
GUILD_ID = "100000000000000003"  # the guild of every channel here
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


@dataclass
class Reply:
    """What to answer: a status, a JSON-able body (or raw bytes), extra headers."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    content_type: str = "application/json"


@dataclass
class DRequest:
    """One request: unquoted path segments, query, lower-cased headers, the whole body."""

    method: str
    segments: list[str]
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    _parsed: tuple[dict[str, Any], list[tuple[str, bytes]]] | None = field(
        default=None, init=False, repr=False
    )

    def payload(self) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
        """The JSON payload (plain, or `payload_json` of a multipart body) and any uploaded files, parsed
        once (the limits check and the handler both read it; neither changes it)."""
        if self._parsed is None:
            self._parsed = self._parse()
        return self._parsed

    def _parse(self) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
        ctype = self.headers.get("content-type", "")
        if not ctype.startswith("multipart/"):
            return (json.loads(self.body) if self.body else {}), []
        # Why the email parser: cgi is gone in 3.13, and discord.py sends plain form-data parts.
        head = f"Content-Type: {ctype}\r\n\r\n".encode()
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + self.body)
        data: dict[str, Any] = {}
        files: list[tuple[str, bytes]] = []
        for part in msg.iter_parts():
            raw = part.get_payload(decode=True)
            content = raw if isinstance(raw, bytes) else b""
            if part.get_param("name", header="content-disposition") == "payload_json":
                data = json.loads(content)
            elif part.get_filename():
                files.append((str(part.get_filename()), content))
        return data, files


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class _Message:
    """One message as the fake keeps it; `wire()` renders Discord's shape."""

    id: str
    channel_id: str
    content: str
    embeds: list[Any]
    attachments: list[dict[str, Any]]
    author: dict[str, Any]
    webhook_id: str | None
    timestamp: str = field(default_factory=_now_iso)
    edited: str | None = None
    edits: list[dict[str, Any]] = field(default_factory=list)
    created: dict[str, Any] = field(default_factory=dict)
    nonce: str | None = None
    type: int = 0  # 18: the notice of a thread started without a message

    def __post_init__(self) -> None:
        self.created = {"content": self.content, "embeds": self.embeds, "at": self.timestamp}

    def wire(self) -> dict[str, Any]:
        """The message object Discord returns (enough for discord.py to build a Message)."""
        out: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "channel_id": self.channel_id,
            "content": self.content,
            "embeds": self.embeds,
            "attachments": self.attachments,
            "author": self.author,
            "timestamp": self.timestamp,
            "edited_timestamp": self.edited,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "pinned": False,
            "flags": 0,
            "components": [],
        }
        if self.webhook_id is not None:
            out["webhook_id"] = self.webhook_id
        return out

    def public(self) -> dict[str, Any]:
        """The row /_fake/state shows: current version plus the creation and every edit."""
        return {
            "id": self.id,
            "content": self.content,
            "embeds": self.embeds,
            "attachments": [a["filename"] for a in self.attachments],
            "webhook_id": self.webhook_id,
            "type": self.type,
            "created": self.created,
            "edits": list(self.edits),
        }


@dataclass
class _Hook:
    """A webhook, or an interaction's token (which Discord also serves under /webhooks/{app_id}/...)."""

    id: str
    token: str
    channel_id: str
    interaction_id: str | None = None
    original_id: str | None = None


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's delayed ACK
    # of the headers, ~40 ms a request on Linux, which would swamp the latencies tests and benches see.
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        if self.headers.get("Upgrade", "").lower() == "websocket":  # the gateway (discord_gateway)
            self.close_connection = True
            self.server.fake.serve_gateway(self.headers, self.rfile, self.wfile, self.connection)
            return
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        request = DRequest(
            method=self.command,
            segments=[unquote(s) for s in split.path.split("/")[1:]],
            query={k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()},
            headers={k.lower(): v for k, v in self.headers.items()},
            body=self.rfile.read(length) if length else b"",
        )
        reply = self.server.fake.dispatch(request)
        if reply is None:  # a "hang" fault: the work is done, the answer never comes
            self.close_connection = True
            return
        payload = (
            reply.raw
            if reply.raw is not None
            else b""
            if reply.body is None
            else json.dumps(reply.body).encode()
        )
        self.send_response(reply.status)
        if reply.status != 204:
            self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(payload)))
        for key, value in reply.headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request stderr line (webhook tokens are in the path)."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeDiscord, port: int) -> None:
        self.fake = fake
        super().__init__(("127.0.0.1", port), _Handler)


def _error(status: int, message: str, code: int = 0) -> Reply:
    return Reply(status, {"message": message, "code": code})


def _rate_limited(retry_after: float, ratelimit_headers: dict[str, str], *, via: bool) -> Reply:
    """Discord's 429: its body, Retry-After and the bucket's X-RateLimit-* headers."""
    headers = {**ratelimit_headers, "Retry-After": f"{retry_after:g}", "X-RateLimit-Scope": "user"}
    if via:  # real 429s come through Google's front end; discord.py's webhooks check for it
        headers["Via"] = "1.1 google"
    body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": False}
    return Reply(429, body, headers)


class FakeDiscord(Served):
    """The fake Discord REST API. Use as a context manager, or `start()` / `stop()`."""

    def __init__(self, token: str = DEFAULT_TOKEN, port: int = 0, rate_limits: Limits | None = None) -> None:
        self.token = token
        self.port = port
        self.lock = threading.RLock()
        self.requests: dict[str, int] = {}
        self.faults: list[DiscordFault] = []
        self.limits = RateLimits(rate_limits)
        self.held = 0  # requests handled whose answer a "hang" fault withheld
        self.served: list[dict[str, str]] = []  # each fault served: its op, kind and channel (major)
        self.channels: dict[str, list[_Message]] = {}
        self.threads: dict[str, dict[str, Any]] = {}  # thread id -> Discord's channel object of the thread
        self.deleted: set[str] = set()  # channels (threads) deleted: Unknown Channel from then on
        self.known: set[str] = set()  # channels that exist (add_channel, a webhook's, an interaction's)
        self.hooks: dict[str, _Hook] = {}  # keyed by token: interactions share their app id
        self.interactions: dict[str, dict[str, Any]] = {}
        self.born: dict[str, float] = {}  # interaction id -> when it was created (monotonic)
        self.files: dict[str, tuple[str, bytes]] = {}
        self.commands: dict[str, list[dict[str, Any]]] = {}  # scope ("global" or a guild id) -> commands
        self.gateway = GatewayState()
        self._ids = itertools.count(1)

    # -- lifecycle (start, url, stop, `with`: tests.fakes.serving); discord.py wants
    # `Route.BASE = f"{url}/api/v10"` -------------------------------------------------------------
    def new_server(self) -> _Server:
        return _Server(self, self.port)

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
        hook = _Hook(self.snowflake(), secrets.token_urlsafe(48), str(channel_id))
        with self.lock:
            self.known.add(hook.channel_id)
            self.hooks[hook.token] = hook
        return int(hook.id), hook.token

    def add_interaction(self, channel_id: int | str, application_id: int | str) -> tuple[int, str]:
        """Register an interaction (as if a slash command arrived); returns (interaction id, token)."""
        iid, token = self.snowflake(), secrets.token_urlsafe(48)
        with self.lock:
            self.known.add(str(channel_id))
            self.hooks[token] = _Hook(str(application_id), token, str(channel_id), interaction_id=iid)
            self.interactions[iid] = {"channel_id": str(channel_id), "callbacks": [], "followups": []}
            self.born[iid] = time.monotonic()  # answered within INTERACTION_ANSWER_S of this, or unknown
        return int(iid), token

    def interaction_payload(
        self,
        command: str,
        options: dict[str, Any] | None = None,
        *,
        user_id: int,
        channel_id: int,
        guild_id: int | None,
        role_ids: tuple[int, ...] = (),
        focused: str | None = None,
    ) -> dict[str, Any]:
        """An INTERACTION_CREATE payload as Discord's gateway sends it for a slash command (or, with
        `focused`, for its autocomplete), registered here so its callback and followups are accepted.

        Option values: str (STRING), bool (BOOLEAN), int (INTEGER), or (filename, bytes) for an ATTACHMENT,
        which the fake then serves for download. No guild_id: a DM."""
        iid, token = self.add_interaction(channel_id, APPLICATION_ID)
        user = {"id": str(user_id), "username": f"user{user_id}", "discriminator": "0", "avatar": None}
        opts: list[dict[str, Any]] = []
        resolved: dict[str, Any] = {}
        for name, value in (options or {}).items():
            if isinstance(value, tuple):
                filename, data = value
                url = self.add_attachment(filename, data)
                aid = url.rsplit("/", 2)[-2]
                resolved.setdefault("attachments", {})[aid] = {
                    "id": aid,
                    "filename": filename,
                    "size": len(data),
                    "url": url,
                    "proxy_url": url,
                }
                opts.append({"name": name, "type": 11, "value": aid})
            else:
                kind = 5 if isinstance(value, bool) else 4 if isinstance(value, int) else 3
                opts.append({"name": name, "type": kind, "value": value})
            if name == focused:
                opts[-1]["focused"] = True
        payload: dict[str, Any] = {
            "id": str(iid),
            "application_id": APPLICATION_ID,
            "type": 4 if focused else 2,
            "token": token,
            "version": 1,
            "channel_id": str(channel_id),
            "data": {
                "id": self.snowflake(),
                "name": command,
                "type": 1,
                "options": opts,
                "resolved": resolved,
            },
            "locale": "en-US",
            "app_permissions": "0",
            "entitlements": [],
            "attachment_size_limit": 26214400,
        }
        if guild_id is None:
            payload.update(
                user=user,
                context=1,
                channel={"id": str(channel_id), "type": 1, "recipients": [user], "last_message_id": None},
            )
            return payload
        payload.update(
            guild_id=str(guild_id),
            guild_locale="en-US",
            context=0,
            authorizing_integration_owners={"0": str(guild_id)},
            member={
                "user": user,
                "roles": [str(r) for r in role_ids],
                "joined_at": _now_iso(),
                "deaf": False,
                "mute": False,
                "flags": 0,
                "permissions": "0",
            },
            channel={
                "id": str(channel_id),
                "type": 0,
                "guild_id": str(guild_id),
                "name": "fleet",
                "position": 0,
                "permission_overwrites": [],
                "nsfw": False,
                "parent_id": None,
            },
        )
        return payload

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
        answers a "hang" fault withheld and each fault served (op, kind, channel)."""
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
            return _error(401, "401: Unauthorized")
        verdict = self.limits.take(op, major)
        if verdict is not None and not verdict.allowed:
            return _rate_limited(verdict.retry_after, verdict.headers, via=True)
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
                    return _error(400, "Interaction has already been acknowledged.", 40060)
                if age > INTERACTION_ANSWER_S:
                    return _error(404, "Unknown interaction", 10062)
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
                    self.served.append({"op": op, "kind": fault.kind, "channel": major})
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
            return _error(500, "500: Internal Server Error")
        headers = {
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": f"{time.time() + fault.retry_after:.3f}",
            "X-RateLimit-Reset-After": f"{fault.retry_after:g}",
            "X-RateLimit-Bucket": op,
        }
        return _rate_limited(fault.retry_after, headers, via=fault.via)

    def _route(self, r: DRequest) -> tuple[str, Callable[[DRequest], Reply], bool]:
        """(operation, handler, whether the credentials are right) for a request."""
        seg, m = r.segments, r.method
        if len(seg) == 3 and seg[0] == "attachments" and m == "GET":
            return "attachment", self._attachment, True
        if tuple(seg[:2]) != _API:
            return "other", lambda _: _error(404, "404: Not Found"), True
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
        return "other", lambda _: _error(404, "404: Not Found"), True

    def _existing(self, handler: Callable[[DRequest], Reply]) -> Callable[[DRequest], Reply]:
        """`handler` for a request to /channels/{id}/..., when that channel (or thread) exists."""

        def in_channel(r: DRequest) -> Reply:
            channel_id = r.segments[3]
            with self.lock:
                exists = channel_id not in self.deleted and (
                    channel_id in self.known or channel_id in self.threads
                )
            return handler(r) if exists else _error(404, "Unknown Channel", 10003)

        return in_channel

    # -- handlers ----------------------------------------------------------------------------------
    def _bot_user(self) -> dict[str, Any]:
        return {
            "id": BOT_USER_ID,
            "username": "fake-bot",
            "discriminator": "0",
            "avatar": None,
            "global_name": None,
            "bot": True,
        }

    def _application(self) -> dict[str, Any]:
        return {
            "id": APPLICATION_ID,
            "name": "fake-app",
            "description": "",
            "icon": None,
            "bot_public": False,
            "bot_require_code_grant": False,
            "owner": self._bot_user(),
            "verify_key": "0" * 64,
            "flags": 0,
        }

    def _put_commands(self, r: DRequest) -> Reply:
        scope = r.segments[5] if len(r.segments) == 7 else "global"
        commands = [
            {**cmd, "id": self.snowflake(), "application_id": APPLICATION_ID, "version": "1"}
            for cmd in json.loads(r.body or b"[]")
        ]
        if scope != "global":
            commands = [{**cmd, "guild_id": scope} for cmd in commands]
        with self.lock:
            self.commands[scope] = commands
        return Reply(200, commands)

    def _target(self, r: DRequest) -> tuple[str, _Hook | None]:
        """(channel id, webhook or None) a message request addresses."""
        rest = r.segments[2:]
        if rest[0] == "channels":
            return rest[1], None
        hook = self.hooks[rest[2]]
        return hook.channel_id, hook

    def _find(self, r: DRequest) -> _Message | None:
        channel_id, hook = self._target(r)
        mid = r.segments[-1]
        if mid == "@original" and hook is not None:
            mid = hook.original_id or ""
        return next((msg for msg in self.channels.get(channel_id, []) if msg.id == mid), None)

    def _store(
        self, channel_id: str, data: dict[str, Any], files: list[tuple[str, bytes]], hook: _Hook | None
    ) -> _Message:
        author = (
            self._bot_user()
            if hook is None
            else {
                "id": hook.id,
                "username": str(data.get("username") or "fake-hook"),
                "discriminator": "0000",
                "avatar": None,
                "bot": True,
            }
        )
        msg = _Message(
            id=self.snowflake(),
            channel_id=channel_id,
            content=str(data.get("content") or ""),
            embeds=list(data.get("embeds") or []),
            attachments=self._attach(files),
            author=author,
            webhook_id=None if hook is None or hook.interaction_id else hook.id,
        )
        with self.lock:
            self.channels.setdefault(channel_id, []).append(msg)
        return msg

    def _attach(self, files: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
        out = []
        for name, data in files:
            url = self.add_attachment(name, data)
            aid = url.rsplit("/", 2)[-2]
            out.append({"id": aid, "filename": name, "size": len(data), "url": url, "proxy_url": url})
        return out

    def _create(self, r: DRequest) -> Reply:
        data, files = r.payload()
        channel_id, nonce = r.segments[3], data.get("nonce")
        if channel_id in self.deleted:
            return _error(404, "Unknown Channel", 10003)
        with self.lock:  # one lock for the lookup and the store: two racing repeats yield one message
            if nonce is not None and data.get("enforce_nonce"):
                earlier = next((m for m in self.channels.get(channel_id, []) if m.nonce == str(nonce)), None)
                if earlier is not None:
                    return Reply(200, earlier.wire())
            msg = self._store(channel_id, data, files, None)
            msg.nonce = None if nonce is None else str(nonce)
        return Reply(200, msg.wire())

    def _start_thread(self, r: DRequest) -> Reply:
        """A public thread in channel c: from message m (the thread's id is m's), or without one (Discord
        then leaves a notice, type 18, whose content is the thread's name, in the parent)."""
        data, _ = r.payload()
        parent, rest = r.segments[3], r.segments[2:]
        name = str(data.get("name") or "")
        if not 1 <= len(name) <= 100:
            return _error(400, "Invalid Form Body: name must be 1 to 100 characters", 50035)
        with self.lock:
            if len(rest) == 5:
                if not any(msg.id == rest[3] for msg in self.channels.get(parent, [])):
                    return _error(404, "Unknown Message", 10008)
                thread_id = rest[3]
                if thread_id in self.threads:
                    return _error(400, "A thread has already been created for this message", 160004)
            else:
                thread_id = self.snowflake()
            thread = {
                "id": thread_id,
                "type": int(data.get("type") or 11),
                "guild_id": GUILD_ID,
                "parent_id": parent,
                "owner_id": BOT_USER_ID,
                "name": name,
                "rate_limit_per_user": 0,
                "message_count": 0,
                "member_count": 1,
                "flags": 0,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": int(data.get("auto_archive_duration") or 1440),
                    "archive_timestamp": _now_iso(),
                    "locked": False,
                },
            }
            self.threads[thread_id] = thread
            self.channels.setdefault(thread_id, [])
        if len(rest) == 3:
            notice = self._store(parent, {"content": name}, [], None)
            notice.type = 18
        return Reply(201, thread)

    def _execute(self, r: DRequest) -> Reply:
        data, files = r.payload()
        channel_id, hook = self._target(r)
        msg = self._store(channel_id, data, files, hook)
        if hook is not None and hook.interaction_id is not None:
            with self.lock:
                record = self.interactions[hook.interaction_id]
                flags = int(data.get("flags") or 0)
                callbacks = record["callbacks"]
                if not record["followups"] and callbacks and callbacks[0]["type"] == 5:
                    # Discord: the first followup after a deferral is the deferred message, as private or
                    # public as the deferral was, whatever its own flags say.
                    flags = int(callbacks[0]["data"].get("flags") or 0)
                record["followups"].append(
                    {"message_id": msg.id, "data": data, "ephemeral": bool(flags & 64)}
                )
        return Reply(200, msg.wire()) if r.query.get("wait") in ("true", "1", "True") else Reply(204)

    def _list(self, r: DRequest) -> Reply:
        msgs = self.channels.get(r.segments[3], [])
        limit = int(r.query.get("limit", 50))
        return Reply(200, [m.wire() for m in reversed(msgs)][:limit])  # newest first, as Discord

    def _get(self, r: DRequest) -> Reply:
        msg = self._find(r)
        return _error(404, "404: Not Found", 10008) if msg is None else Reply(200, msg.wire())

    def _edit(self, r: DRequest) -> Reply:
        if r.segments[2] == "channels" and r.segments[3] in self.deleted:
            return _error(404, "Unknown Channel", 10003)
        msg = self._find(r)
        if msg is None:
            return _error(404, "Unknown Message", 10008)
        data, files = r.payload()
        with self.lock:
            if "content" in data:
                msg.content = str(data["content"] or "")
            if "embeds" in data:
                msg.embeds = list(data["embeds"] or [])
            if "attachments" in data:  # v10: the attachments to keep, by id (and the new uploads')
                keep = {str(a.get("id")) for a in data["attachments"] or []}
                msg.attachments = [a for a in msg.attachments if a["id"] in keep]
            msg.attachments += self._attach(files)
            msg.edited = _now_iso()
            msg.edits.append({"content": msg.content, "embeds": msg.embeds, "at": msg.edited})
        return Reply(200, msg.wire())

    def _info(self, r: DRequest) -> Reply:
        _, hook = self._target(r)
        assert hook is not None
        return Reply(
            200,
            {
                "id": hook.id,
                "type": 1,
                "token": hook.token,
                "channel_id": hook.channel_id,
                "guild_id": None,
                "name": "fake-hook",
                "avatar": None,
                "application_id": None,
            },
        )

    def _callback(self, r: DRequest) -> Reply:
        data, files = r.payload()
        hook = self.hooks[r.segments[4]]
        iid = str(hook.interaction_id)
        kind = int(data.get("type", 0))
        inner = dict(data.get("data") or {})
        msg = None
        if kind in (4, 5):  # CHANNEL_MESSAGE_WITH_SOURCE, DEFERRED_...: an original response exists
            msg = self._store(hook.channel_id, inner, files, hook)
            hook.original_id = msg.id
        with self.lock:
            self.interactions[iid]["callbacks"].append({"type": kind, "data": inner})
        interaction = {
            "id": iid,
            "type": 2,
            "response_message_id": msg.id if msg else None,
            "response_message_loading": kind == 5,
            "response_message_ephemeral": bool(int(inner.get("flags") or 0) & 64),
        }
        resource = {"type": kind, "message": msg.wire()} if msg else None
        if r.query.get("with_response") in ("1", "true", "True"):
            return Reply(200, {"interaction": interaction, "resource": resource})
        return Reply(204)

    def _attachment(self, r: DRequest) -> Reply:
        found = self.files.get(r.segments[1])
        if found is None or found[0] != r.segments[2]:
            return _error(404, "404: Not Found")
        return Reply(200, raw=found[1], content_type="application/octet-stream")
