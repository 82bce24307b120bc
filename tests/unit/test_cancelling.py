"""`fleet.live.cancelling`, the signal rule of the commands that wait on runs (`fleet run`, `fleet sweep
--wait`): the first Ctrl-C, SIGTERM or SIGHUP cancels and goes on; the second leaves (the first too, when
nothing is queued yet); the handlers before it are back after it."""

from __future__ import annotations

import os
import signal

import pytest

from fleet.live import cancelling


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_the_first_signal_cancels_and_the_second_leaves(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    cancelled: list[str] = []
    with pytest.raises(KeyboardInterrupt), cancelling(lambda: not cancelled.append("sweep"), "sweep"):
        os.kill(os.getpid(), sig)  # delivered before kill() returns: the handler has run
        assert cancelled == ["sweep"]  # cancelled, and still inside: following it to its end
        os.kill(os.getpid(), sig)
        pytest.fail("the second signal did not leave")
    assert cancelled == ["sweep"] and signal.getsignal(sig) is before


def test_a_signal_before_anything_was_queued_leaves_at_once() -> None:
    """Entered before the submit: a signal then finds no run to cancel, and the command leaves (its worker
    stopped on the way out) instead of dying by the default handler with its worker left running."""
    with pytest.raises(KeyboardInterrupt), cancelling(lambda: False, "run"):
        os.kill(os.getpid(), signal.SIGTERM)
        pytest.fail("the signal did not leave")
