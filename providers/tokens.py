"""The Ray tokens of rented nodes: one fresh token per instance, in the fleet's store of node secrets
(providers.sealed: sealed in its Redis, or owner-only files under the fleet's home). The ledger and events
hold only the instance name (the reference); the token travels in the instance's environment at create
time and in request headers, never anywhere else. The nodes of one cluster share its head's token.

A node that runs JupyterLab (`jupyter: true`) has a token of its own for it, made the same way and kept
beside the Ray token (`<name>.jupyter`): shown only to whoever holds the fleet's seal key (`fleet jupyter`).

A node reached by its public address (vast.ai) serves its Jobs API over TLS (providers.onnode.tlsfront) with a
certificate made here for it alone (`<name>.crt`, `<name>.key`): its key travels in the node's environment at
create time, over the vendor's HTTPS API, like the Ray token (the host machine's owner can read both, as they
can read everything on their machine anyway), and the fleet trusts that one certificate and no other.
"""

from __future__ import annotations

import datetime
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from providers.sealed import FileStore, SecretStore

HEAD_SUFFIX = ".head"  # beside a worker node's token: the name of the head it joined
JUPYTER_SUFFIX = ".jupyter"  # beside a node's token: its JupyterLab's token
CERT_SUFFIX = ".crt"  # beside a node's token: the TLS certificate the fleet pins for it (PEM)
KEY_SUFFIX = ".key"  # ... and its private key, which only the node needs
SUFFIXES = (HEAD_SUFFIX, JUPYTER_SUFFIX, CERT_SUFFIX, KEY_SUFFIX)
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
    """Tokens by instance name, in the fleet's store of node secrets (providers.sealed): sealed in its Redis
    when it has one, else under `<home>/secrets/nodes/` (directory 700, files 600)."""

    def __init__(self, home: Path, store: SecretStore | None = None) -> None:
        self.local = FileStore(home / "secrets" / "nodes")
        self.store: SecretStore = store if store is not None else self.local

    def ensure(self, name: str) -> str:
        """The instance's token, made now if it has none yet (a relaunch after a crash reuses it)."""
        return self.store.add(name, secrets.token_hex(32))

    def join(self, name: str, head: str) -> str:
        """The token of a worker node that joins `head`'s cluster: the head's own (Ray's token auth lets
        only holders of the cluster's token join). Records that `name` is a worker of `head`."""
        token = self.get(head)
        if token is None:
            raise KeyError(f"no token for the head {head!r}")
        if self.get(name) != token:
            self.store.put(name, token)
        if self.head_of(name) != head:
            self.store.put(name + HEAD_SUFFIX, head)
        return token

    def ensure_jupyter(self, name: str) -> str:
        """The token of the node's JupyterLab, made now if it has none yet (a relaunch reuses it)."""
        return self.store.add(name + JUPYTER_SUFFIX, secrets.token_urlsafe(32))

    def jupyter(self, name: str) -> str | None:
        """The node's JupyterLab token; None when it was created without one."""
        return self.get(name + JUPYTER_SUFFIX)

    def ensure_tls(self, name: str) -> tuple[str, str]:
        """The node's TLS certificate and key (PEM), made now if it has none yet (a relaunch reuses them)."""
        cert, key = self.get(name + CERT_SUFFIX), self.get(name + KEY_SUFFIX)
        if cert is None or key is None:
            cert, key = self_signed(name)
            self.store.put(name + KEY_SUFFIX, key)
            self.store.put(name + CERT_SUFFIX, cert)
        return cert, key

    def tls_pin(self, name: str) -> Path | None:
        """The file of the node's certificate, the only one the fleet trusts for it (kept in this machine's
        home, whatever the store); None: it has none."""
        cert = self.get(name + CERT_SUFFIX)
        if cert is None:
            return None
        field = name + CERT_SUFFIX
        if self.local.get(field) != cert.strip():
            self.local.put(field, cert)
        return self.local.path(field)

    def head_of(self, name: str) -> str | None:
        """The head whose cluster `name` joined as a worker node; None for a head (or an unknown name)."""
        return self.get(name + HEAD_SUFFIX)

    def get(self, name: str) -> str | None:
        return self.store.get(name)

    def forget(self, name: str) -> None:
        fields = [name, *(name + suffix for suffix in SUFFIXES)]
        self.store.drop(fields)
        if self.store is not self.local:
            self.local.drop(fields)  # files kept before the fleet sealed its tokens in Redis
