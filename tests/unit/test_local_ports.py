"""providers.local.ports: a local Ray node's ports lie below the ephemeral range (where no outgoing
connection takes one before the node binds it), and a block with a port in use is passed over."""

from __future__ import annotations

import itertools
import socket

import pytest

from providers.local import ports


def test_a_block_lies_below_the_ephemeral_range_and_its_ports_are_distinct() -> None:
    named, (low, high) = ports.port_block(9)
    assert len(set(named)) == 9
    assert high - low + 1 == ports.WORKER_PORTS
    assert not set(named) & set(range(low, high + 1))
    assert min(named) >= ports.LOWEST and max(*named, high) < ports.ephemeral_start()


def test_a_block_with_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        top = taken + 9 + ports.WORKER_PORTS + 1000  # room for a block that starts at the taken port
        monkeypatch.setattr(ports, "ephemeral_start", lambda: top)
        monkeypatch.setattr(ports, "LOWEST", taken - 3)  # the taken port is the 4th of the first block
        # The first draw is the block with the taken port; the later ones lie beyond it (any of them may
        # be in use by another process of this machine too: a busy one is passed over as well).
        offsets = itertools.chain([0], itertools.count(500, 37))
        drawn: list[int] = []
        monkeypatch.setattr(ports.secrets, "randbelow", lambda _n: drawn.append(next(offsets)) or drawn[-1])
        named, _workers = ports.port_block(9)
    assert taken not in named
    assert len(drawn) >= 2 and named[0] == taken - 3 + drawn[-1] != taken - 3


def test_no_room_below_the_range_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_start", lambda: ports.LOWEST + 100)
    with pytest.raises(OSError, match="below the ephemeral range"):
        ports.port_block(9)
