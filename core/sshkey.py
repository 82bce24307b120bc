"""The fleet's SSH public key (the `ssh_public_key` setting): an OpenSSH public key line, given as its text
or as the path of a `.pub` file. It is installed on every rented node, so that a node kept for debugging
can be entered (`fleet ssh RUN`). A public key is not a secret; a private key is refused outright.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from pathlib import Path

from pydantic import BaseModel, ConfigDict

KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ssh-dss",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
_LINE = re.compile(
    r"(?P<type>[a-z0-9@.-]+) (?P<blob>[A-Za-z0-9+/]+={0,2})(?: (?P<comment>[^\x00-\x1f\x7f]*))?"
)
MAX_LENGTH = 16_384  # an RSA-16384 key line is about 2.8 kB


class SshPublicKey(BaseModel):
    """The key line, and the `.pub` file it was read from (None: given as text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    line: str
    path: Path | None = None

    @property
    def identity_file(self) -> Path | None:
        """The private key beside the `.pub` file (`id_ed25519` for `id_ed25519.pub`), when it is there:
        what `ssh -i` names. None for a key given as text."""
        if self.path is None or self.path.suffix != ".pub":
            return None
        private = self.path.with_suffix("")
        return private if private.is_file() else None


def check_key_line(text: str) -> str:
    """The one-line OpenSSH public key in `text` (`<type> <base64> [comment]`), stripped; ValueError saying
    what is wrong otherwise. The base64 blob must decode and name the same key type as the line does."""
    line = text.strip()
    if "PRIVATE KEY" in line:
        raise ValueError("this is a private key: give the public key (the .pub file), never the private one")
    if not line or len(line) > MAX_LENGTH or "\n" in line or "\r" in line:
        raise ValueError("must be one OpenSSH public key line, `<type> <base64> [comment]`")
    match = _LINE.fullmatch(line)
    if match is None or match["type"] not in KEY_TYPES:
        raise ValueError(
            "not an OpenSSH public key line (`ssh-ed25519 AAAA... [comment]`, or the path of a .pub file)"
        )
    if _blob_type(match["blob"]) != match["type"]:
        raise ValueError(f"the key's data is not a {match['type']} key")
    return line


def _blob_type(blob: str) -> str | None:
    """The key type an OpenSSH key blob starts with (a length-prefixed string), or None when unreadable."""
    try:
        raw = base64.b64decode(blob, validate=True)
        (length,) = struct.unpack(">I", raw[:4])
        return raw[4 : 4 + length].decode("ascii") if 0 < length <= len(raw) - 4 else None
    except (binascii.Error, struct.error, UnicodeDecodeError):
        return None


def parse_ssh_public_key(value: str | Path) -> SshPublicKey:
    """The key from its text, or from the file at `value` (`~` expanded) when it is not a key line."""
    text = str(value).strip()
    if text.split(" ", 1)[0] in KEY_TYPES or "PRIVATE KEY" in text:
        return SshPublicKey(line=check_key_line(text))
    path = Path(text).expanduser()
    if not path.is_file():
        raise ValueError(
            f"neither an OpenSSH public key line nor the path of a readable .pub file: {path} does not exist"
        )
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {type(exc).__name__}") from None
    return SshPublicKey(line=check_key_line(content), path=path.absolute())
