"""The fake Discord's gateway: enough of Discord's WebSocket gateway (v10, JSON, uncompressed text frames)
for discord.py 2.7's own client to connect, identify, become ready and keep its heartbeat.

`GET /api/v10/gateway/bot` (bot token) answers the gateway's URL, `ws://127.0.0.1:<port>` (the fake's own
port: a WebSocket upgrade on any path there is the gateway). On a connection the fake sends HELLO
(`heartbeat_interval_ms`), and answers IDENTIFY with READY (the bot user, no guilds, a session id, the
resume URL, the application) when its token is the fake's, else closes with 4004 "Authentication failed",
as Discord does; a HEARTBEAT gets its HEARTBEAT_ACK, a RESUME a RESUMED. Not served: events (interactions
are delivered by the tests, tests.fakes.discord.interaction_payload), compression (discord.py reads text
frames as they are), sharding, presence and voice.

Counted in the fake's state under "gateway": connections, identified sessions, heartbeats, sessions open
now. `FakeDiscord.close_gateway()` closes every open session (code 4000, which a client resumes from) and
refuses new ones until `open_gateway()`: a Discord that dropped the bot.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import IO, Any

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455's: the handshake's accept key is made with it
TEXT, CLOSE, PING, PONG = 0x1, 0x8, 0x9, 0xA
DISPATCH, HEARTBEAT, IDENTIFY, RESUME, HELLO, HEARTBEAT_ACK = 0, 1, 2, 6, 10, 11
AUTH_FAILED, UNKNOWN_ERROR = 4004, 4000


@dataclass
class GatewayState:
    """What the fake's gateway saw, and whether it serves."""

    heartbeat_interval_ms: int = 41250
    refusing: bool = False
    connections: int = 0
    identified: int = 0
    resumed: int = 0
    heartbeats: int = 0
    sockets: list[socket.socket] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def public(self) -> dict[str, int]:
        with self.lock:
            return {
                "connections": self.connections,
                "identified": self.identified,
                "resumed": self.resumed,
                "heartbeats": self.heartbeats,
                "open": len(self.sockets),
            }

    def close_all(self) -> None:
        """Drop every open session (4000: the client may resume), refusing new ones until reopened."""
        with self.lock:
            self.refusing = True
            open_now, self.sockets = list(self.sockets), []
        for sock in open_now:
            try:
                sock.sendall(_frame(CLOSE, struct.pack("!H", UNKNOWN_ERROR) + b"Unknown error"))
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def gateway_bot(port: int) -> dict[str, Any]:
    """`GET /gateway/bot`'s answer."""
    limit = {"total": 1000, "remaining": 999, "reset_after": 86_400_000, "max_concurrency": 1}
    return {"url": f"ws://127.0.0.1:{port}", "shards": 1, "session_start_limit": limit}


def serve(
    headers: dict[str, str],
    reader: IO[bytes],
    writer: IO[bytes],
    sock: socket.socket,
    state: GatewayState,
    token: str,
    ready: dict[str, Any],
) -> None:
    """One gateway connection, on a request whose `headers` (lower-case names) ask for a WebSocket: the
    handshake, then frames until either side closes. `ready` is READY's payload, less the session."""
    key = headers.get("sec-websocket-key", "")
    with state.lock:
        state.connections += 1
        refusing = state.refusing
    if not key or refusing:
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        writer.flush()
        return
    accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    writer.write(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        + f"Sec-WebSocket-Accept: {accept}\r\n\r\n".encode()
    )
    writer.flush()
    with state.lock:
        state.sockets.append(sock)
    sequence = 0

    def send(payload: dict[str, Any]) -> None:
        writer.write(_frame(TEXT, json.dumps(payload).encode()))
        writer.flush()

    try:
        send({"op": HELLO, "d": {"heartbeat_interval": state.heartbeat_interval_ms}, "s": None, "t": None})
        while True:
            opcode, data = _read_frame(reader)
            if opcode == CLOSE:
                writer.write(_frame(CLOSE, data[:2]))
                writer.flush()
                return
            if opcode == PING:
                writer.write(_frame(PONG, data))
                writer.flush()
                continue
            if opcode != TEXT:
                continue
            message = json.loads(data)
            op = message.get("op")
            if op == HEARTBEAT:
                with state.lock:
                    state.heartbeats += 1
                send({"op": HEARTBEAT_ACK, "d": None, "s": None, "t": None})
            elif op in (IDENTIFY, RESUME):
                if message["d"].get("token") != token:
                    writer.write(_frame(CLOSE, struct.pack("!H", AUTH_FAILED) + b"Authentication failed."))
                    writer.flush()
                    return
                sequence += 1
                with state.lock:
                    state.identified += op == IDENTIFY
                    state.resumed += op == RESUME
                if op == IDENTIFY:
                    session = {"session_id": secrets.token_hex(16), "v": 10, "shard": [0, 1]}
                    send({"op": DISPATCH, "t": "READY", "s": sequence, "d": {**ready, **session}})
                else:
                    send({"op": DISPATCH, "t": "RESUMED", "s": sequence, "d": {}})
    except (OSError, EOFError, ValueError):
        return
    finally:
        with state.lock:
            if sock in state.sockets:
                state.sockets.remove(sock)


def _frame(opcode: int, payload: bytes) -> bytes:
    """A server's frame: final, unmasked."""
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
    return head + payload


def _read_frame(reader: IO[bytes]) -> tuple[int, bytes]:
    """A client's frame (masked, as RFC 6455 requires of clients); fragments are joined."""
    opcode, parts = 0, []
    while True:
        first, second = _exactly(reader, 2)
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", _exactly(reader, 2))
        elif size == 127:
            (size,) = struct.unpack("!Q", _exactly(reader, 8))
        mask = _exactly(reader, 4) if second & 0x80 else b"\0\0\0\0"
        data = _exactly(reader, size)
        parts.append(bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        opcode = opcode or first & 0x0F
        if first & 0x80:
            return opcode, b"".join(parts)


def _exactly(reader: IO[bytes], size: int) -> bytes:
    data = reader.read(size) if size else b""
    if len(data) < size:
        raise EOFError("the gateway connection closed")
    return data
