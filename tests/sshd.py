"""A real OpenSSH server on this machine's loopback, for the tests of pool machines (providers.ssh).

Each `Sshd` is its own `sshd -D` with a host key and a client key made for it, listening on 127.0.0.1 at a
port of its own, letting in one user with that key only. Run as root (CI), the user is `tfpool`, a user
of its own made once (useradd), so a job on a pool machine runs as someone other than the fleet, as it
would on a real one; the key is authorised in that user's ~/.ssh, under sshd's StrictModes. Run as anyone
else, the server runs as that user and lets in only that user (sshd's rule for an unprivileged server).
Needs the Debian package openssh-server (`make test-tools` installs it as root).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from providers.ssh.pools import Machine

POOL_USER = "tfpool"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keypair(path: Path) -> str:
    """Make an ed25519 key at `path` (and `path`.pub); its public line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def pool_user() -> str:
    """The user the server lets in: `tfpool` (made once) as root, else whoever runs the tests."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    with open("/tmp/tf-sshd-user.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(POOL_USER)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", POOL_USER], check=True)
            subprocess.run(["usermod", "-p", "*", POOL_USER], check=True)  # no password, not locked
    return POOL_USER


@dataclass
class Sshd:
    """One running server: where it listens, whom it lets in, and the files a fleet needs to reach it."""

    home: Path
    port: int
    user: str
    key: Path
    host_key: str
    known_hosts: Path
    extra: list[str] = field(default_factory=list)
    authorized: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    def machine(self, pool: str = "lab", gpus: int = 0, **changes: object) -> Machine:
        """The server as a pool machine."""
        values: dict[str, object] = {
            "pool": pool, "host": "127.0.0.1", "port": self.port, "user": self.user, "key": self.key,
            "gpus": gpus, "gpu": None, "labels": (), "hourly_usd": 0.0, "host_key": None,
        }  # fmt: skip
        return Machine.model_validate(values | changes)

    @property
    def log(self) -> str:
        return (self.home / "sshd.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop the server and take its key out of the user's home."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        if self.authorized is not None and not self.authorized.is_relative_to(self.home):
            self.authorized.unlink(missing_ok=True)


def _authorize(home: Path, user: str, public: str) -> tuple[Path, bool]:
    """Where sshd finds the key, and whether its StrictModes hold there."""
    if os.geteuid() != 0:
        path = home / "authorized_keys"
        path.write_text(public + "\n")
        return path, False
    entry = pwd.getpwnam(user)
    dot_ssh = Path(entry.pw_dir) / ".ssh"
    dot_ssh.mkdir(mode=0o700, exist_ok=True)
    path = dot_ssh / f"tf-test-{uuid.uuid4().hex[:12]}"
    path.write_text(public + "\n")
    for p in (dot_ssh, path):
        os.chown(p, entry.pw_uid, entry.pw_gid)
    path.chmod(0o600)
    return path, True


def start_sshd(home: Path, extra: list[str] | None = None) -> Sshd:
    """Start a server under `home` (its keys, config and log) and wait until it answers."""
    if not Path(SSHD).exists():
        pytest.fail("sshd is not installed: `make test-tools` (as root) or `apt install openssh-server`")
    home.mkdir(parents=True, exist_ok=True)
    user = pool_user()
    host_key = keypair(home / "host_key")
    public = keypair(home / "client_key")
    authorized, strict = _authorize(home, user, public)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    server = Sshd(home, 0, user, home / "client_key", host_key, home / "known_hosts", extra or [], authorized)
    for _ in range(5):  # a port another test took between free_port and sshd's bind: take another
        server.port = free_port()
        config = home / "sshd_config"
        config.write_text(_config(server, authorized, strict))
        server.known_hosts.write_text(f"[127.0.0.1]:{server.port} {host_key}\n")
        with open(home / "sshd.log", "ab") as log:
            server.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=log)
        if _answers(server):
            return server
        server.stop()
    raise RuntimeError(f"sshd did not start: {server.log[-2000:]}")


def _config(server: Sshd, authorized: Path, strict: bool) -> str:
    lines = [
        f"Port {server.port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {server.home / 'host_key'}",
        f"PidFile {server.home / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}",
        f"StrictModes {'yes' if strict else 'no'}",
        f"AllowUsers {server.user}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "PermitRootLogin no",
        "LogLevel VERBOSE",
        *server.extra,
    ]
    return "\n".join(lines) + "\n"


def _answers(server: Sshd, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            return False
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", server.port), 0.5) as s:
            if s.recv(4).startswith(b"SSH-"):
                return True
        time.sleep(0.05)
    return False
