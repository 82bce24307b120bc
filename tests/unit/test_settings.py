"""Settings: the environment over the file over the defaults; bad values are ConfigErrors."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import load_settings


def test_defaults_with_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.yml").write_text("")
    settings = load_settings({"FLEET_SETTINGS_FILE": str(tmp_path / "empty.yml")})
    assert settings.redis_url is None and settings.default_provider == "local"
    assert settings.reap_interval_s == 30


def test_a_named_settings_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read settings file"):
        load_settings({"FLEET_SETTINGS_FILE": str(tmp_path / "absent.yml")})


def test_file_then_environment_wins(tmp_path: Path) -> None:
    path = tmp_path / "settings.yml"
    path.write_text("poll_interval_s: 3\nreap_interval_s: 7\nhome: /srv/fleet\n")
    settings = load_settings(
        {"FLEET_SETTINGS_FILE": str(path), "FLEET_REAP_INTERVAL_S": "9", "REDIS_URL": "redis://h:1/0"}
    )
    assert settings.poll_interval_s == 3 and settings.reap_interval_s == 9
    assert settings.home == Path("/srv/fleet") and settings.runs_dir == Path("/srv/fleet/runs")
    assert settings.redis_url == "redis://h:1/0"
    assert settings.public()["redis_url"] == "<set>"  # a URL may carry a password


@pytest.mark.parametrize(
    ("content", "env", "needle"),
    [
        ("poll_interval_s: -1\n", {}, "poll_interval_s"),
        ("no_such_setting: 1\n", {}, "no_such_setting"),
        ("- a list\n", {}, "mapping"),
        ("{}\n", {"FLEET_STALL_AFTER_S": "soon"}, "stall_after_s"),
    ],
)
def test_invalid_settings_name_the_key(
    tmp_path: Path, content: str, env: dict[str, str], needle: str
) -> None:
    path = tmp_path / "settings.yml"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_settings({"FLEET_SETTINGS_FILE": str(path), **env})
    assert needle in str(caught.value)
