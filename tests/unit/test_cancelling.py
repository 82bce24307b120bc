"""`fleet.live.cancelling`, the signal rule of the commands that wait on runs (`fleet run`, `fleet sweep
--wait`): the first Ctrl-C, SIGTERM or SIGHUP cancels and goes on; the second leaves; the handlers before it
are back after it."""

from __future__ import annotations

import os
import signal

import pytest

from fleet.live import cancelling


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_the_first_signal_cancels_and_the_second_leaves(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    cancelled: list[str] = []
    with pytest.raises(KeyboardInterrupt), cancelling(lambda: cancelled.append("sweep"), "sweep"):
        os.kill(os.getpid(), sig)  # delivered before kill() returns: the handler has run
        assert cancelled == ["sweep"]  # cancelled, and still inside: following it to its end
        os.kill(os.getpid(), sig)
        pytest.fail("the second signal did not leave")
    assert cancelled == ["sweep"] and signal.getsignal(sig) is before
