"""The fleet's `ssh_public_key` setting: an OpenSSH public key line, as text or as a .pub file's path; every
other value is refused as a settings problem that says what is wrong."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import load_settings
from core.sshkey import parse_ssh_public_key
from providers.world import World


def key_line(kind: str = "ssh-ed25519", named: str | None = None, comment: str = "me@laptop") -> str:
    """A well-formed public key line: the blob names `named` (default: `kind`) as its type."""
    blob = b"".join(
        struct.pack(">I", len(part)) + part for part in ((named or kind).encode(), bytes(range(32)))
    )
    return f"{kind} {base64.b64encode(blob).decode()} {comment}".strip()


def settings_with(tmp_path: Path, value: str) -> object:
    (tmp_path / "settings.yml").write_text("{}\n")
    env = {"FLEET_SETTINGS_FILE": str(tmp_path / "settings.yml"), "FLEET_SSH_PUBLIC_KEY": value}
    return load_settings(env).ssh_public_key


def test_unset_means_no_key_and_no_key_for_the_providers(tmp_path: Path) -> None:
    (tmp_path / "settings.yml").write_text("{}\n")
    settings = load_settings({"FLEET_SETTINGS_FILE": str(tmp_path / "settings.yml")})
    assert settings.ssh_public_key is None
    assert World.of(settings).context.ssh_public_key is None


def test_a_key_line_from_the_environment(tmp_path: Path) -> None:
    line = key_line()
    key = parse_ssh_public_key(f"  {line}\n")
    assert key.line == line and key.path is None and key.identity_file is None
    (tmp_path / "settings.yml").write_text("{}\n")
    env = {"FLEET_SETTINGS_FILE": str(tmp_path / "settings.yml"), "FLEET_SSH_PUBLIC_KEY": line}
    settings = load_settings(env)
    assert settings.ssh_public_key == key
    assert World.of(settings).context.ssh_public_key == line  # what the providers install on the nodes


def test_a_pub_file_in_the_settings_file_with_its_private_key_beside_it(tmp_path: Path) -> None:
    pub = tmp_path / "id_ed25519.pub"
    pub.write_text(key_line() + "\n")
    (tmp_path / "settings.yml").write_text(f"ssh_public_key: {pub}\n")
    key = load_settings({"FLEET_SETTINGS_FILE": str(tmp_path / "settings.yml")}).ssh_public_key
    assert key is not None and key.line == key_line() and key.path == pub
    assert key.identity_file is None  # no private key beside it: ssh chooses its own
    (tmp_path / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert key.identity_file == tmp_path / "id_ed25519"


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("not a key", "does not exist"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn...\n", "private key"),
        ("ssh-ed25519 !!notbase64!!", "not an OpenSSH public key line"),
        ("ssh-foo AAAAC3NzaC1lZDI1NTE5AAAAIA==", "does not exist"),  # not a type of OpenSSH's: a path
        (key_line("ssh-ed25519", named="ssh-rsa"), "not a ssh-ed25519 key"),
        (key_line() + "\n" + key_line(), "one OpenSSH public key line"),
        ("ssh-ed25519 AAAA", "not a ssh-ed25519 key"),
    ],
)
def test_what_is_not_a_public_key_line_is_refused(tmp_path: Path, value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_with(tmp_path, value)
    assert "ssh_public_key" in str(caught.value) and needle in str(caught.value)


def test_a_private_key_file_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "id_ed25519"
    private.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="this is a private key"):
        settings_with(tmp_path, str(private))


def test_every_openssh_key_type_is_accepted(tmp_path: Path) -> None:
    for kind in ("ssh-rsa", "ecdsa-sha2-nistp256", "sk-ssh-ed25519@openssh.com"):
        assert parse_ssh_public_key(key_line(kind, comment="")).line.startswith(kind + " ")
