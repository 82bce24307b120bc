"""The bot's access rule (fail-closed) and what a user's runs cost, as pure functions."""

from __future__ import annotations

import pytest

from bot.access import Caller, instance_cost, refusal
from broker.models import Instance, InstanceState
from fleet.settings import Settings, load_settings

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


def test_instance_cost_counts_time_up() -> None:
    running = Instance(name="a", provider="runpod", run_id="r", price_per_hour=2.0, created_at=0.0)
    assert instance_cost(running, now=1800.0) == 1.0
    ended = running.model_copy(update={"state": InstanceState.TERMINATED, "updated_at": 3600.0})
    assert instance_cost(ended, now=99999.0) == 2.0
    assert instance_cost(running.model_copy(update={"price_per_hour": None}), now=1800.0) == 0.0
