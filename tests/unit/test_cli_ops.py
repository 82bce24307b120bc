"""`fleet flower`: the Host names it answers to, and that it refuses to start without knowing them. (The
guard against a live Flower, the password and its file: tests/security/test_flower.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.cli import cli
from providers.node import is_loopback
from service.flower_guard import allowed_hosts


@pytest.mark.parametrize(
    ("address", "local"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("", False), ("10.0.0.5", False), ("::", False), ("flower.example", False)],
)  # fmt: skip
def test_only_loopback_addresses_are_local(address: str, local: bool) -> None:
    assert is_loopback(address) is local


def test_the_hosts_flower_answers_to() -> None:
    assert allowed_hosts("127.0.0.1", 5600) == {"127.0.0.1:5600", "localhost:5600", "[::1]:5600"}
    assert "127.0.0.2:5600" in allowed_hosts("127.0.0.2", 5600)  # the bound address itself
    assert allowed_hosts("10.0.0.5", 5555) == {"10.0.0.5:5555"}
    assert allowed_hosts("0.0.0.0", 5555, ["Flower.Example", "ops:8080", "::1"]) == {
        "flower.example:5555",
        "ops:8080",
        "[::1]:5555",
    }
    assert "localhost" in allowed_hosts("127.0.0.1", 80)  # browsers leave port 80 out of Host
    for everywhere in ("0.0.0.0", "", "::"):
        with pytest.raises(ValueError, match="--host"):
            allowed_hosts(everywhere, 5555)


def test_fleet_flower_on_every_interface_without_its_host_names_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["flower", "--address", "0.0.0.0"])
    assert result.exit_code == 2 and "--host" in result.output
    assert list(tmp_path.iterdir()) == []  # refused before anything was started or written


def test_a_malformed_flower_basic_auth_exits_2_without_quoting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_HOME", str(tmp_path))
    monkeypatch.setenv("FLOWER_BASIC_AUTH", "s3cretonly")
    result = CliRunner().invoke(cli, ["flower"])
    assert result.exit_code == 2 and "FLOWER_BASIC_AUTH" in result.output
    assert "s3cret" not in result.output and not (tmp_path / "redis").exists()


def test_the_cli_prints_a_fingerprint_as_it_is_never_as_an_emoji(capsys: pytest.CaptureFixture[str]) -> None:
    """rich's emoji codes turned ":CD:" in a certificate's SHA-256 fingerprint into a compact disc, so the
    fingerprint `fleet jupyter` asks its user to check was wrong (a clean-clone CI met one)."""
    from fleet.cli_common import err, out

    said = "SHA-256 fingerprint 6D:05:8A:CD:CC:E5 (and :smile: too)"
    out.print(said, markup=False, highlight=False)
    err.print(said, markup=False, highlight=False)
    printed = capsys.readouterr()
    assert said in printed.out and said in printed.err, printed
