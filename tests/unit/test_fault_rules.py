"""The fakes' fault rules, as parsed from what a test posts to /_fake/faults."""

from __future__ import annotations

import pytest

from tests.fakes.base import Fault
from tests.fakes.discord import DiscordFault
from tests.fakes.hub import HubFault


def test_fields_take_their_declared_types_and_defaults() -> None:
    assert Fault.from_json({"op": "create", "kind": "timeout", "delay": 2}) == Fault(
        op="create", kind="timeout", delay=2.0
    )
    assert HubFault.from_json({"kind": "disconnect", "after_bytes": "12"}).after_bytes == 12
    assert (
        HubFault.from_json({"kind": "500"}).after_bytes is None
        and HubFault.from_json({"kind": "500"}).op == "*"
    )
    rule = DiscordFault.from_json({"kind": "429", "every": 0, "via": False, "seen": 9})
    assert (rule.every, rule.via, rule.seen, rule.times) == (
        1,
        False,
        0,
        1,
    )  # seen is the fake's, not the rule's


@pytest.mark.parametrize("rule", [Fault, HubFault, DiscordFault])
def test_an_unknown_kind_is_refused_by_name(rule: type[Fault | HubFault | DiscordFault]) -> None:
    with pytest.raises(ValueError, match="unknown fault kind 'nope'; valid: "):
        rule.from_json({"kind": "nope"})
