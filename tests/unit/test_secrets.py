"""Credentials come from the environment or an owner-only file, and are never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError, CredentialsMissing
from core.secrets import FLEET_CREDENTIALS, load_secrets
from core.settings import Settings
from providers.registry import load_fleet_secrets
from providers.world import World

CANARY = "rpa_CANARY0123456789abcdefghijklmnopqrstuv"


def secrets_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "secrets.yml"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_environment_wins_over_the_file(tmp_path: Path) -> None:
    path = secrets_file(tmp_path, f"RUNPOD_API_KEY: from-file\nVAST_API_KEY: {CANARY}\n")
    secrets = load_fleet_secrets({"FLEET_SECRETS_FILE": str(path), "RUNPOD_API_KEY": "from-env"})
    context = World.of(Settings(home=tmp_path), secrets).context
    assert context.credential("RUNPOD_API_KEY").get_secret_value() == "from-env"
    vast_key = context.credential("VAST_API_KEY")
    assert vast_key.get_secret_value() == CANARY
    assert CANARY not in repr(secrets) and CANARY not in str(vast_key) and CANARY not in repr(context)


def test_a_missing_credential_is_named_with_where_to_put_it(tmp_path: Path) -> None:
    context = World(Settings(home=tmp_path), env={"FLEET_SECRETS_FILE": str(tmp_path / "none.yml")}).context
    with pytest.raises(CredentialsMissing, match=r"VAST_API_KEY is not set.*secrets file"):
        context.credential("VAST_API_KEY")


def test_a_readable_by_others_file_is_refused(tmp_path: Path) -> None:
    path = secrets_file(tmp_path, f"RUNPOD_API_KEY: {CANARY}\n", mode=0o644)
    with pytest.raises(ConfigError, match="chmod 600") as caught:
        load_fleet_secrets({"FLEET_SECRETS_FILE": str(path)})
    assert CANARY not in str(caught.value)


@pytest.mark.parametrize(
    "text", [f"RUNPOD_API_KEY: [{CANARY}\n", f"- {CANARY}\n", f"RUNPD_API_KEY: {CANARY}\n"]
)
def test_a_bad_file_never_echoes_its_values(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_fleet_secrets({"FLEET_SECRETS_FILE": str(secrets_file(tmp_path, text))})
    assert CANARY not in str(caught.value)


def test_the_fleet_s_own_credentials_are_always_known_and_others_only_when_named(tmp_path: Path) -> None:
    env = {"FLEET_SECRETS_FILE": str(tmp_path / "none.yml"), "HF_TOKEN": "hf", "MY_CLOUD_KEY": "k"}
    assert set(load_secrets(env).values) == {"HF_TOKEN"}
    assert set(load_secrets(env, known=["MY_CLOUD_KEY"]).values) == {"HF_TOKEN", "MY_CLOUD_KEY"}
    path = secrets_file(tmp_path, "MY_CLOUD_KEY: k\n")
    with pytest.raises(ConfigError, match="unknown credential; known: " + ", ".join(FLEET_CREDENTIALS)):
        load_secrets({"FLEET_SECRETS_FILE": str(path)})
    assert load_secrets({"FLEET_SECRETS_FILE": str(path)}, known=["MY_CLOUD_KEY"]).get("MY_CLOUD_KEY")
