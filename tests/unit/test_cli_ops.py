"""`fleet flower`: who may use its HTTP API, and where its files go."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.cli import cli
from fleet.cli_ops import decide_access, flower_argv, is_local


@pytest.mark.parametrize(
    ("address", "local"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("", False), ("10.0.0.5", False), ("::", False), ("flower.example", False)],
)  # fmt: skip
def test_only_loopback_addresses_are_local(address: str, local: bool) -> None:
    assert is_local(address) is local


def test_the_api_is_open_on_this_machine_and_needs_a_password_elsewhere() -> None:
    assert decide_access("127.0.0.1", {}, no_auth=False) == "open-api"
    assert decide_access("0.0.0.0", {"FLOWER_BASIC_AUTH": "ops:s3cret"}, no_auth=False) == "auth"
    assert decide_access("0.0.0.0", {"FLOWER_AUTH": ".*@example\\.com"}, no_auth=False) == "auth"
    assert decide_access("0.0.0.0", {}, no_auth=True) == "no-auth"
    with pytest.raises(ValueError, match="FLOWER_BASIC_AUTH=user:password"):
        decide_access("0.0.0.0", {}, no_auth=False)
    # Flower itself would accept FLOWER_UNAUTHENTICATED_API; binding beyond this machine still refuses.
    with pytest.raises(ValueError):
        decide_access("0.0.0.0", {"FLOWER_UNAUTHENTICATED_API": "true"}, no_auth=False)


@pytest.mark.parametrize("value", ["s3cretonly", "ops:", ":s3cret", "ops:s3cret,broken"])
def test_a_malformed_basic_auth_is_refused_without_quoting_it(value: str) -> None:
    with pytest.raises(ValueError) as raised:
        decide_access("0.0.0.0", {"FLOWER_BASIC_AUTH": value}, no_auth=False)
    assert "s3cret" not in str(raised.value)


def test_flower_keeps_its_files_under_the_fleet_home(tmp_path: Path) -> None:
    argv = flower_argv(tmp_path, 5600, "127.0.0.1", persistent=True)
    assert argv[:3] == ["flower", "--port=5600", "--address=127.0.0.1"]
    assert f"--conf={tmp_path / 'flower' / 'flowerconfig.py'}" in argv  # never ./flowerconfig.py
    assert "--persistent=True" in argv and f"--db={tmp_path / 'flower' / 'flower.db'}" in argv
    assert not any(
        a.startswith(("--persistent", "--db")) for a in flower_argv(tmp_path, 1, "", persistent=False)
    )


def test_fleet_flower_on_every_interface_without_a_password_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    monkeypatch.delenv("FLOWER_AUTH", raising=False)
    monkeypatch.setenv("FLEET_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["flower", "--address", "0.0.0.0"])
    assert result.exit_code == 2 and "FLOWER_BASIC_AUTH" in result.output
    assert not (tmp_path / "redis").exists()  # refused before anything was started
