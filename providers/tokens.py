"""The Ray tokens of rented nodes: one fresh token per instance, in an owner-only file under the fleet's
home. The ledger and events hold only the instance name (the reference); the token travels in the
instance's environment at create time and in request headers, never anywhere else. The nodes of one
cluster share its head's token.

A node that runs JupyterLab (`jupyter: true`) has a token of its own for it, made the same way and kept
beside the Ray token (`<name>.jupyter`): shown only to whoever holds the fleet's home (`fleet jupyter`).

A node reached by its public address (vast.ai) serves its Jobs API over TLS (providers.tlsfront) with a
certificate made here for it alone (`<name>.crt`, `<name>.key`): its key travels in the node's environment at
create time, over the vendor's HTTPS API, like the Ray token (the host machine's owner can read both, as they
can read everything on their machine anyway), and the fleet trusts that one certificate and no other.
"""

from __future__ import annotations

import datetime
import os
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HEAD_SUFFIX = ".head"  # beside a worker node's token: the name of the head it joined
JUPYTER_SUFFIX = ".jupyter"  # beside a node's token: its JupyterLab's token
CERT_SUFFIX = ".crt"  # beside a node's token: the TLS certificate the fleet pins for it (PEM)
KEY_SUFFIX = ".key"  # ... and its private key, which only the node needs
CERT_DAYS = 398  # longer than any node lives (a node's `terminate_after` of -1 still ends with its run)


def self_signed(name: str) -> tuple[str, str]:
    """(certificate, key) in PEM: a fresh P-256 key and a self-signed certificate for the node `name`."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"trainfleet node {name}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()


class NodeTokens:
    """Tokens by instance name, under `<home>/secrets/nodes/` (directory 700, files 600)."""

    def __init__(self, home: Path) -> None:
        self.dir = home / "secrets" / "nodes"

    def _path(self, name: str) -> Path:
        if "/" in name or name.startswith("."):
            raise ValueError(f"not an instance name: {name!r}")
        return self.dir / name

    def ensure(self, name: str) -> str:
        """The instance's token, made now if it has none yet (a relaunch after a crash reuses it)."""
        existing = self.get(name)
        if existing is not None:
            return existing
        token = secrets.token_hex(32)
        self._write(self._path(name), token)
        return token

    def join(self, name: str, head: str) -> str:
        """The token of a worker node that joins `head`'s cluster: the head's own (Ray's token auth lets
        only holders of the cluster's token join). Records that `name` is a worker of `head`."""
        token = self.get(head)
        if token is None:
            raise KeyError(f"no token for the head {head!r}")
        if self.get(name) != token:
            self._path(name).unlink(missing_ok=True)
            self._write(self._path(name), token)
        if self.head_of(name) != head:
            self._path(name + HEAD_SUFFIX).unlink(missing_ok=True)
            self._write(self._path(name + HEAD_SUFFIX), head)
        return token

    def ensure_jupyter(self, name: str) -> str:
        """The token of the node's JupyterLab, made now if it has none yet (a relaunch reuses it)."""
        existing = self.jupyter(name)
        if existing is not None:
            return existing
        token = secrets.token_urlsafe(32)
        self._write(self._path(name + JUPYTER_SUFFIX), token)
        return token

    def jupyter(self, name: str) -> str | None:
        """The node's JupyterLab token; None when it was created without one."""
        return self.get(name + JUPYTER_SUFFIX)

    def ensure_tls(self, name: str) -> tuple[str, str]:
        """The node's TLS certificate and key (PEM), made now if it has none yet (a relaunch reuses them)."""
        cert, key = self.get(name + CERT_SUFFIX), self.get(name + KEY_SUFFIX)
        if cert is None or key is None:
            cert, key = self_signed(name)
            for suffix, text in ((CERT_SUFFIX, cert), (KEY_SUFFIX, key)):
                self._path(name + suffix).unlink(missing_ok=True)
                self._write(self._path(name + suffix), text)
        return cert, key

    def tls_pin(self, name: str) -> Path | None:
        """The file of the node's certificate, the only one the fleet trusts for it; None: it has none."""
        path = self._path(name + CERT_SUFFIX)
        return path if path.is_file() else None

    def head_of(self, name: str) -> str | None:
        """The head whose cluster `name` joined as a worker node; None for a head (or an unknown name)."""
        return self.get(name + HEAD_SUFFIX)

    def _write(self, path: Path, text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)

    def get(self, name: str) -> str | None:
        try:
            return self._path(name).read_text().strip() or None
        except FileNotFoundError:
            return None

    def forget(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)
        for suffix in (HEAD_SUFFIX, JUPYTER_SUFFIX, CERT_SUFFIX, KEY_SUFFIX):
            self._path(name + suffix).unlink(missing_ok=True)
