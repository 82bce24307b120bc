"""Celery Flower behind the fleet's own guard, built the way `celery flower` builds it.

Flower's HTTP API can send, revoke and shut down tasks and workers, so a web page open in the user's
browser must not reach it: bound to 127.0.0.1 it is still reachable by any page through DNS rebinding (a
name that resolves to 127.0.0.1) or a cross-site form post. Every request first passes `Guard.refusal`:

- its Host must be one Flower was told it is served as (127.0.0.1:<port>, localhost:<port>, [::1]:<port>
  on loopback; the bound address; and any `--host` given): else 403 (DNS rebinding);
- a request that changes something (any method but GET/HEAD/OPTIONS, or a websocket upgrade) whose
  Origin or Referer is present must come from one of those hosts: else 403 (CSRF);
- it must carry one of Flower's `user:password` pairs (HTTP basic auth): else 401. Only /healthcheck
  is open (it says "OK" and nothing else).

The check wraps the Application's `find_handler`, so it runs before any of Flower's handlers, including
ones that forget `@authenticated`. Flower's own basic-auth check stays on behind it.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import tornado.web
from tornado import httputil

from providers.node import is_loopback

if TYPE_CHECKING:
    from celery import Celery

STATE_SAVE_INTERVAL_MS = 60_000
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS = frozenset({"/healthcheck"})


def _with_port(name: str, port: int) -> str:
    """`name` as a Host header carries it: lower case, IPv6 in brackets, with `port` unless it has one."""
    name = name.strip().lower()
    try:
        if ipaddress.ip_address(name).version == 6:
            name = f"[{name}]"
    except ValueError:
        pass
    if name.endswith("]") or ":" not in name:
        return f"{name}:{port}"
    return name


def allowed_hosts(address: str, port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host values Flower answers to: the loopback names when bound to loopback, the bound address
    when it is one, and `extra` (a name, `name:port`). Raises ValueError when there are none (bound to
    every interface, nothing named): Flower would not know which names are its own."""
    hosts = {_with_port(name, port) for name in extra if name.strip()}
    if is_loopback(address):  # binding it serves this machine only
        hosts |= {_with_port(name, port) for name in ("127.0.0.1", "localhost", "::1", address)}
    elif address and not (_is_ip(address) and ipaddress.ip_address(address).is_unspecified):
        hosts.add(_with_port(address, port))
    if not hosts:
        raise ValueError(
            f"flower on {address or 'every interface'} needs --host NAME[:PORT] (the names browsers reach "
            "it by; each request's Host must be one of them)"
        )
    if port == 80:  # browsers leave the default port out of Host
        hosts |= {h.rsplit(":", 1)[0] for h in hosts}
    return frozenset(hosts)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: its HTTP status and a line saying why (never a credential)."""

    status: int
    why: str


@dataclass(frozen=True)
class Guard:
    """The hosts Flower is served as and the credentials it accepts; `refusal` judges one request."""

    hosts: frozenset[str]
    credentials: tuple[str, ...]

    def refusal(self, method: str, path: str, headers: Mapping[str, str]) -> Refusal | None:
        """None when the request may reach Flower, else why not (Host, then Origin/Referer, then auth)."""
        host = headers.get("Host", "").strip().lower()
        if host not in self.hosts:
            return Refusal(403, "this Flower is not served under that Host name (DNS rebinding?)")
        changes = method.upper() not in SAFE_METHODS or headers.get("Upgrade", "").lower() == "websocket"
        if changes:
            for name in ("Origin", "Referer"):
                value = headers.get(name)
                if value is not None and not self._same_origin(value):
                    return Refusal(403, f"cross-origin {method} refused ({name} is not this Flower)")
        if path not in OPEN_PATHS and not self._authorized(headers.get("Authorization", "")):
            return Refusal(401, "Flower needs its user and password (HTTP basic auth)")
        return None

    def _same_origin(self, value: str) -> bool:
        parts = urlsplit(value.strip())
        return parts.scheme in ("http", "https") and parts.netloc.lower() in self.hosts

    def _authorized(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given = base64.b64decode(encoded.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        # Every credential is compared, so the time taken does not tell which one nearly matched.
        matches = [hmac.compare_digest(given.encode(), c.encode()) for c in self.credentials]
        return any(matches)


class RefusedHandler(tornado.web.RequestHandler):
    """Answers a refused request with its status and reason, before any of Flower's handlers runs."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "DELETE", "PATCH", "PUT", "OPTIONS")

    def initialize(self, refusal: Refusal) -> None:
        self.refused = refusal

    def prepare(self) -> None:
        self.set_status(self.refused.status)
        if self.refused.status == 401:
            self.set_header("WWW-Authenticate", 'Basic realm="flower"')
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(self.refused.why + "\n")


def guarded(flower_class: type[Any], guard: Guard) -> type[Any]:
    """`flower_class` (Flower's tornado Application) whose every request is judged by `guard` first."""

    class GuardedFlower(flower_class):  # type: ignore[misc]
        def find_handler(self, request: httputil.HTTPServerRequest, **kwargs: Any) -> Any:
            refused = guard.refusal(request.method or "GET", request.path, request.headers)
            if refused is not None:
                return self.get_handler_delegate(request, RefusedHandler, {"refusal": refused})
            return super().find_handler(request, **kwargs)

    return GuardedFlower


@dataclass(frozen=True)
class FlowerServe:
    """Where and how Flower serves: the port, the bound address, its state directory, history kept."""

    port: int
    address: str
    state_dir: Path
    persistent: bool = False


def serve(capp: Celery, where: FlowerServe, guard: Guard) -> None:
    """Run Flower on `capp` in this process (until SIGTERM or Ctrl-C), as `celery flower` would, with its
    options set here: FLOWER_* variables still apply, but no config file is read (Flower would execute a
    flowerconfig.py from the working directory), and the credentials never leave this process."""
    import flower.command as flower_command  # type: ignore[import-untyped]
    from flower.app import Flower  # type: ignore[import-untyped]
    from flower.urls import settings as flower_settings  # type: ignore[import-untyped]
    from tornado.options import options

    flower_command.apply_env_options()  # FLOWER_ENABLE_EVENTS and the like, as before
    options.port, options.address = where.port, where.address
    options.basic_auth = list(guard.credentials)  # Flower's own check, behind ours
    if where.persistent:
        options.persistent = True
        options.db = str(where.state_dir / "flower.db")
        options.state_save_interval = STATE_SAVE_INTERVAL_MS
    flower_command.extract_settings()
    flower_command.setup_logging()
    app = guarded(Flower, guard)(capp=capp, options=options, **flower_settings)
    signal.signal(signal.SIGTERM, flower_command.sigterm_handler)
    try:
        app.start()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        app.stop()
