"""The node's failsafe: a rented node gives itself back when the fleet is gone, so it does not stay billing.

The start script (providers.bootstrap) runs this file on the node, before the Ray head, as
`python3 -c SOURCE VENDOR`: the standard library only, nothing of the fleet's, no secret of the fleet's. It
destroys its own instance with the key its vendor put in the container (vast.ai's CONTAINER_API_KEY,
RunPod's pod-scoped RUNPOD_API_KEY) once
- FLEET_DEADLINE_S seconds have passed since it started (the node's maximum lifetime), or
- no heartbeat came for FLEET_HEARTBEAT_TIMEOUT_S seconds. The clock starts with the failsafe, so a node
  the fleet never reaches goes too.

A heartbeat is a call of the fleet's (User-Agent `trainfleet/<version> heartbeat`) that the node's token let
through, as the Ray dashboard's access log shows it: `<ray temp dir>/session_latest/logs/dashboard.log`,
the temp dir being FLEET_RAY_TEMP_DIR or Ray's own default. Every stage poll makes one, and the reaper pings
each node it keeps (providers.node.ping). The log need not exist yet (the head starts after the failsafe),
and it is followed across rotation and truncation.

The failsafe writes one line to stderr saying why it gives the node back, then asks its vendor until the
vendor accepts (the node may be cut off for a while; being destroyed ends this process too).

The node's environment is also the job's, whose `env` may set proxies and CA bundles for its own downloads
(HTTPS_PROXY, ALL_PROXY, NO_PROXY, SSL_CERT_FILE, SSL_CERT_DIR, SSLKEYLOGFILE...). None of them reaches the
give-back: it goes straight to the vendor, and its TLS trusts the system's authorities where OpenSSL was
built to find them. A job could otherwise send the call to a proxy that swallows it, or make the vendor's
certificate fail, and keep its node billing.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import BinaryIO

# Every name read here is one a job's env may not set: FLEET_*, and the others listed in core.envnames'
# NODE_READS (this module runs on the node alone, so it cannot import that; a test holds them in step).
DEADLINE_ENV = "FLEET_DEADLINE_S"
HEARTBEAT_ENV = "FLEET_HEARTBEAT_TIMEOUT_S"
RAY_TEMP_ENV = "FLEET_RAY_TEMP_DIR"
VAST_URL_ENV = "FLEET_VAST_URL"  # the API the fleet uses (a fake's in tests)
RUNPOD_URL_ENV = "FLEET_RUNPOD_URL"
HEAD_ENV = "FLEET_RAY_HEAD_ADDRESS"  # on a cluster's worker node: the head it joined (host:port)
USER_AGENT = "trainfleet/{version} heartbeat"  # what the fleet sends; the pattern below matches it
POLL_S = 1.0
MAX_RETRY_S = 60.0
# One access line of the dashboard (aiohttp's `%a %t '%r' %s %b bytes %D us '%{Referer}i' '%{User-Agent}i'`,
# after Ray's `<time> INFO <file>:<line> -- `) for a call of the fleet's that the token let through. Neither
# /api/version nor /api/jobs/... is public, so a 2xx or 404 there means a good token (a bad one gets 401 or
# 403). The request must be the first quoted field and hold no dots or escapes: a path such as
# /api/jobs/../healthz would reach a public route, and quotes in a request could fake the fields after it.
HEARTBEAT = re.compile(
    r"^[^']* -- \S+ \[[^\]']*\] '[A-Z]+ /api/(?:version|jobs/[\w/-]*) HTTP/[\d.]+' (?:2\d\d|404) "
    r".*'trainfleet/[^' ]+ heartbeat'$"
)
RUNPOD_TERMINATE = "mutation Terminate($input: PodTerminateInput!) { podTerminate(input: $input) }"


class GiveBackRefused(Exception):
    """The vendor answered, but did not destroy the instance."""


def is_heartbeat(line: str) -> bool:
    """Whether a line of the dashboard's log records a heartbeat of the fleet's."""
    return HEARTBEAT.match(line.rstrip("\r\n")) is not None


class LogTail:
    """The lines appended to a file since the last call, whether or not it exists yet. What it holds when
    the tail starts is old; a file that appears later, or anew under the name (rotation, once the old one
    is drained), is read from its start, and so is one that shrank (truncation)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._handle: BinaryIO | None = None
        self._inode = 0
        self._partial = b""  # the start of a line still being written
        self._open()
        if self._handle is not None:
            self._handle.seek(0, os.SEEK_END)

    def lines(self) -> list[str]:
        """The complete lines that are new since the last call."""
        try:
            now: os.stat_result | None = os.stat(self.path)
        except OSError:
            now = None
        found = self._read()
        if self._handle is not None and (now is None or now.st_ino != self._inode):
            self._close()  # rotated or removed: the old file is drained and done
        elif self._handle is not None and now is not None and now.st_size < self._handle.tell():
            self._handle.seek(0)  # truncated: read it again from its start
            self._partial = b""
            found += self._read()
        if self._handle is None and now is not None:
            self._open()
            found += self._read()
        return found

    def _read(self) -> list[str]:
        if self._handle is None:
            return []
        *complete, self._partial = (self._partial + self._handle.read()).split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete]

    def _open(self) -> None:
        try:
            self._handle = open(self.path, "rb")  # noqa: SIM115 - held open from one call to the next
        except OSError:
            return
        self._inode = os.fstat(self._handle.fileno()).st_ino

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.close()
        self._handle = None
        self._partial = b""


def log(message: str) -> None:
    print(f"trainfleet failsafe: {message}", file=sys.stderr, flush=True)


def seconds(env: Mapping[str, str], name: str) -> float | None:
    """A number of seconds from the environment; None (off) when unset, empty, 0 or negative."""
    value = float(env.get(name) or 0)
    return value if value > 0 else None


def dashboard_log(env: Mapping[str, str]) -> str:
    """Where the Ray head on this node logs its dashboard: under FLEET_RAY_TEMP_DIR, else under Ray's own
    default temp dir (RAY_TMPDIR, else TMPDIR, else /tmp; then `ray`)."""
    temp_dir = env.get(RAY_TEMP_ENV) or os.path.join(
        env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp", "ray"
    )
    return os.path.join(temp_dir, "session_latest", "logs", "dashboard.log")


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def vendor_opener(env: Mapping[str, str]) -> urllib.request.OpenerDirector:
    """urllib for the vendor's API: no proxy whatever the environment says (an empty ProxyHandler), and TLS
    that checks the vendor's certificate and name against the system's authorities at OpenSSL's built-in
    paths, named here: OpenSSL's default paths would follow SSL_CERT_FILE and SSL_CERT_DIR, and
    ssl.create_default_context would open SSLKEYLOGFILE, all of which a job may set."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies and checks names; trusts nothing yet
    paths = ssl.get_default_verify_paths()
    if os.path.isfile(paths.openssl_cafile):
        context.load_verify_locations(paths.openssl_cafile)
    if os.path.isdir(paths.openssl_capath):
        context.load_verify_locations(capath=paths.openssl_capath)
    https = urllib.request.HTTPSHandler(context=context)
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), https)


def destroy_vastai(env: Mapping[str, str]) -> Callable[[], None]:
    """vast.ai: DELETE the instance (CONTAINER_ID) with its own key (CONTAINER_API_KEY)."""
    url = f"{env[VAST_URL_ENV].rstrip('/')}/api/v0/instances/{env['CONTAINER_ID']}/"
    headers = _bearer(env["CONTAINER_API_KEY"])
    opener = vendor_opener(env)

    def destroy() -> None:
        try:
            opener.open(urllib.request.Request(url, headers=headers, method="DELETE"), timeout=30).close()
        except urllib.error.HTTPError as exc:
            if exc.code != 404:  # 404: gone already
                raise

    return destroy


def terminate_runpod(env: Mapping[str, str]) -> Callable[[], None]:
    """RunPod: the podTerminate mutation for RUNPOD_POD_ID with the pod's own key (RUNPOD_API_KEY inside a
    pod is RunPod's key for that pod only)."""
    url = f"{env[RUNPOD_URL_ENV].rstrip('/')}/graphql"
    variables = {"input": {"podId": env["RUNPOD_POD_ID"]}}
    body = json.dumps({"query": RUNPOD_TERMINATE, "variables": variables}).encode()
    headers = {**_bearer(env["RUNPOD_API_KEY"]), "Content-Type": "application/json"}
    opener = vendor_opener(env)

    def terminate() -> None:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with opener.open(request, timeout=30) as reply:
            answer = json.loads(reply.read() or b"{}")
        errors = answer.get("errors") if isinstance(answer, dict) else None
        messages = [str(error.get("message")) for error in errors or []]
        if any("not found" not in message.lower() for message in messages):  # not found: gone already
            raise GiveBackRefused("; ".join(messages))

    return terminate


# How a node of each vendor gives itself back (the start script names the vendor).
GIVE_BACK: dict[str, Callable[[Mapping[str, str]], Callable[[], None]]] = {
    "vastai": destroy_vastai,
    "runpod": terminate_runpod,
}


def head_answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether the Ray head at `host:port` accepts a connection."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def watch(
    heard: Callable[[], bool],
    deadline_s: float | None,
    timeout_s: float | None,
    silence: str = "no heartbeat from the fleet",
    never: str = "the fleet never reached it",
) -> str:
    """Wait until the node has to go; say why. `heard` says whether a heartbeat came since it was last
    asked; `silence` names what did not come, `never` what it means when none ever came."""
    started = last = time.monotonic()
    ever = False
    while True:
        if heard():
            last, ever = time.monotonic(), True
        now = time.monotonic()
        if deadline_s is not None and now - started >= deadline_s:
            return f"the node's maximum lifetime of {deadline_s:g} s is over"
        if timeout_s is not None and now - last >= timeout_s:
            since = "" if ever else f" ({never})"
            return f"{silence} for {timeout_s:g} s{since}"
        time.sleep(POLL_S)


def give_back_until_done(give_back: Callable[[], None]) -> None:
    """Ask the vendor until it accepts, waiting longer each time (a minute at most)."""
    wait = POLL_S
    while True:
        try:
            give_back()
            return
        except (OSError, ValueError, GiveBackRefused) as exc:  # urllib's errors are OSErrors
            log(f"the vendor did not take the node back ({exc}); asking again in {wait:g} s")
        time.sleep(wait)
        wait = min(wait * 2, MAX_RETRY_S)


def main(argv: list[str], env: Mapping[str, str]) -> int:
    """`VENDOR`: watch, then give the node back. Returns at once when there is nothing to watch, or when
    the node could not be given back (the environment lacks what its vendor needs)."""
    vendor = argv[0] if argv else ""
    if vendor not in GIVE_BACK:
        log(f"off: unknown vendor {vendor!r}; known: {', '.join(GIVE_BACK)}")
        return 2
    try:
        deadline_s, timeout_s = seconds(env, DEADLINE_ENV), seconds(env, HEARTBEAT_ENV)
        if deadline_s is None and timeout_s is None:
            log(f"off: neither {DEADLINE_ENV} nor {HEARTBEAT_ENV} is set")
            return 0
        give_back = GIVE_BACK[vendor](env)
    except (ValueError, ssl.SSLError) as exc:  # a number, or the system's authorities, that cannot be read
        log(f"off: {exc}")
        return 2
    except KeyError as exc:
        log(f"off: {exc.args[0]} is not set")
        return 2
    head = env.get(HEAD_ENV)
    if head:  # a worker node: it lives as long as its cluster's head answers (the fleet talks to the head)
        silence = f"no answer from the Ray head at {head}"
        reason = watch(lambda: head_answers(head), deadline_s, timeout_s, silence, "it never answered")
    else:
        tail = LogTail(dashboard_log(env))
        reason = watch(lambda: any(is_heartbeat(line) for line in tail.lines()), deadline_s, timeout_s)
    log(f"{reason}: giving this {vendor} instance back")
    give_back_until_done(give_back)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.environ))
