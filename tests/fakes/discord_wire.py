"""HTTP plumbing of the fake Discord: requests (JSON or multipart), replies, messages and webhooks as the
fake keeps them, the threaded server, and Discord's error and 429 shapes."""

from __future__ import annotations

import email.parser
import email.policy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

BOT_USER_ID = "100000000000000001"
APPLICATION_ID = "100000000000000002"
GUILD_ID = "100000000000000003"  # the guild of every channel here


class Fake(Protocol):
    """What the server asks of the fake: an answer per request (None: withheld), and the gateway."""

    def dispatch(self, request: DRequest) -> Reply | None: ...

    def serve_gateway(self, headers: Any, reader: Any, writer: Any, sock: Any) -> None: ...


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


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class Message:
    """One message as the fake keeps it; `wire()` renders Discord's shape."""

    id: str
    channel_id: str
    content: str
    embeds: list[Any]
    attachments: list[dict[str, Any]]
    author: dict[str, Any]
    webhook_id: str | None
    timestamp: str = field(default_factory=now_iso)
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
class Hook:
    """A webhook, or an interaction's token (which Discord also serves under /webhooks/{app_id}/...)."""

    id: str
    token: str
    channel_id: str
    interaction_id: str | None = None
    original_id: str | None = None


class DiscordHandler(BaseHTTPRequestHandler):
    """Reads a request, asks the fake, writes its reply (or, for a WebSocket upgrade, serves the gateway)."""

    server: DiscordServer
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


class DiscordServer(ThreadingHTTPServer):
    """The fake's threaded server."""

    daemon_threads = True

    def __init__(self, fake: Fake, port: int) -> None:
        self.fake = fake
        super().__init__(("127.0.0.1", port), DiscordHandler)


def error_reply(status: int, message: str, code: int = 0) -> Reply:
    """An error in Discord's shape: its message and JSON error code."""
    return Reply(status, {"message": message, "code": code})


def rate_limited(retry_after: float, ratelimit_headers: dict[str, str], *, via: bool) -> Reply:
    """Discord's 429: its body, Retry-After and the bucket's X-RateLimit-* headers."""
    headers = {**ratelimit_headers, "Retry-After": f"{retry_after:g}", "X-RateLimit-Scope": "user"}
    if via:  # real 429s come through Google's front end; discord.py's webhooks check for it
        headers["Via"] = "1.1 google"
    body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": False}
    return Reply(429, body, headers)
