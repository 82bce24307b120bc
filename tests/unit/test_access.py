"""The bot's access rule (fail-closed), as a pure function of the caller and the settings."""

from __future__ import annotations

import pytest

from bot.access import Caller, refusal
from core.settings import Settings, load_settings

LISTED = Settings(discord_allowed_users=(1,), discord_allowed_roles=(10,), discord_allowed_channels=(100,))


@pytest.mark.parametrize(
    ("caller", "allowed"),
    [
        (Caller(1, frozenset(), 100, 5), True),  # a listed user
        (Caller(2, frozenset({10, 11}), 100, 5), True),  # a listed role
        (Caller(2, frozenset({11}), 100, 5), False),  # neither
        (Caller(1, frozenset({10}), 101, 5), False),  # the wrong channel
        (Caller(1, frozenset({10}), 100, None), False),  # a DM
    ],
)
def test_refusal(caller: Caller, allowed: bool) -> None:
    assert (refusal(LISTED, caller) is None) is allowed


def test_empty_allowlists_allow_nobody() -> None:
    for settings in (
        Settings(),
        Settings(discord_allowed_channels=(100,)),  # a channel, but no user and no role
        Settings(discord_allowed_users=(1,), discord_allowed_roles=(10,)),  # no channel
    ):
        assert refusal(settings, Caller(1, frozenset({10}), 100, 5)) is not None


def test_ids_from_the_environment() -> None:
    env = {"FLEET_SETTINGS_FILE": "/dev/null", "FLEET_DISCORD_ALLOWED_ROLES": " 10, 11 ,"}
    assert load_settings(env).discord_allowed_roles == (10, 11)
