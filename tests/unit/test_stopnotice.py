"""A trainer told its machine is going (SIGTERM, or the node's stop notice) keeps a checkpoint at the step it
reached, within a bound, and waits to be killed; the next start of the same job resumes from that step.
The real trainer (`python -m trainer train`) in its own process, in one process (no Ray)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path

import pytest

from tests.factories import train_config, train_job, trainer_command
from trainer import progress
from trainer.stopnotice import NOTICE_ENV, SAVED_SUFFIX, StopNotice

NOTICE_FILE, SAVED_FILE = "stop-notice", "stop-notice" + SAVED_SUFFIX

BOUND_S = 60.0  # from the notice to the checkpoint line: the rest of a step and one save, on a slow CPU


def lines_of(text: str) -> list[dict[str, object]]:
    return list(progress.parse(text))


@pytest.mark.parametrize("how", ["sigterm"])  # the notice file: test_sigterm_and_the_notice_file_say_the_same
def test_a_stopped_trainer_keeps_its_step_and_the_next_one_resumes_there(tmp_path: Path, how: str) -> None:
    root = tmp_path / "node"
    root.mkdir()
    (root / NOTICE_FILE).write_text("a leftover of an earlier container\n")  # older: never obeyed
    old = time.time() - 3600
    os.utime(root / NOTICE_FILE, (old, old))
    config = train_config(
        max_steps=100_000, eval_steps=None, save_steps=None, logging_steps=1, val_set_size=0
    )
    job = train_job(tmp_path, config)
    argv, env = trainer_command(tmp_path, job, **{NOTICE_ENV: str(root / NOTICE_FILE)})
    out = tmp_path / "out.log"
    with out.open("w") as sink, (tmp_path / "err.log").open("w") as errors:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=errors, text=True)
        try:
            deadline = time.monotonic() + 300
            while not any(r.get("kind") == "step" for r in lines_of(out.read_text())):
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err.log").read_text()
                time.sleep(0.2)
            told = time.monotonic()
            if how == "sigterm":
                proc.send_signal(signal.SIGTERM)
            else:
                (root / NOTICE_FILE).write_text("preempted\n")
            while not (root / SAVED_FILE).exists():  # what the node's start script waits for
                assert proc.poll() is None, "the trainer ended instead of waiting for its machine to stop"
                assert time.monotonic() - told < BOUND_S, "no checkpoint within the bound"
                time.sleep(0.1)
            time.sleep(0.5)
            assert proc.poll() is None  # it waits to be killed with the machine: no failed job
        finally:
            proc.kill()
            proc.wait(30)
    said = lines_of(out.read_text())
    steps = [int(str(r["step"])) for r in said if r.get("kind") == "step"]
    (saved,) = [int(str(r["step"])) for r in said if r.get("kind") == "checkpoint"]
    assert saved == steps[-1] and 0 < saved < 100_000  # the step it reached, not the end
    why = "SIGTERM" if how == "sigterm" else "the node's stop notice"
    (stopped,) = [r for r in said if r.get("kind") == "stopped"]  # said before the node is told
    assert stopped["step"] == saved and str(stopped["why"]).startswith(why)
    assert 0 < float(str(stopped["saved_in_s"])) < BOUND_S
    assert f"trainer: stopping at step {saved} ({why}" in (tmp_path / "err.log").read_text()

    # The same job on the "next machine", with the checkpoint where it was left: it goes on from there.
    again = tmp_path / "again.log"
    with again.open("w") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.DEVNULL, text=True)
        try:
            deadline = time.monotonic() + 300
            while not any(r.get("kind") == "step" for r in lines_of(again.read_text())):
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        finally:
            proc.kill()
            proc.wait(30)
    went_on = lines_of(again.read_text())
    (resumed,) = [r for r in went_on if r.get("kind") == "resumed"]
    assert resumed["step"] == saved
    assert next(r for r in went_on if r.get("kind") == "step")["step"] == saved + 1


def test_an_old_notice_or_none_is_no_stop(tmp_path: Path) -> None:
    assert StopNotice({}).why() is None
    notice = StopNotice({NOTICE_ENV: str(tmp_path / NOTICE_FILE)})
    assert notice.why() is None
    (tmp_path / NOTICE_FILE).write_text("")
    old = time.time() - 60
    os.utime(tmp_path / NOTICE_FILE, (old, old))
    assert notice.why() is None
    (tmp_path / NOTICE_FILE).touch()
    assert notice.why() == f"the node's stop notice ({tmp_path / NOTICE_FILE})"


def test_axolotls_trainer_saves_at_the_step_it_was_told_and_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fleet's callback inside axolotl's HF Trainer: the notice makes that step save (HF's own
    checkpoint-N), and once saved the process waits for its machine rather than ending the job."""
    from types import SimpleNamespace

    from trainer import stopnotice
    from trainer.axolotl_callback import FleetCallback

    monkeypatch.setenv(NOTICE_ENV, str(tmp_path / NOTICE_FILE))
    monkeypatch.setattr(stopnotice, "WAIT_S", 0.0)
    push: Future[None] = Future()  # HF's background push of the checkpoint (hub_strategy), not done yet
    trainer = SimpleNamespace(push_in_progress=SimpleNamespace(wait_until_done=lambda: futures.wait([push])))
    callback = FleetCallback(trainer, {}, None, tmp_path / "result.json")
    args = SimpleNamespace(output_dir=str(tmp_path / "out"))
    state = SimpleNamespace(global_step=7, is_world_process_zero=True)
    control = SimpleNamespace(should_save=False)
    callback.on_step_end(args, state, control)
    assert control.should_save is False  # no notice, no save
    (tmp_path / NOTICE_FILE).write_text("preempted\n")
    callback.on_step_end(args, state, control)
    assert control.should_save is True
    threading.Timer(0.5, push.set_result, (None,)).start()
    started = time.monotonic()
    with pytest.raises(SystemExit, match="told to stop at step 7"):
        callback.on_save(args, state, control)
    assert push.done() and time.monotonic() - started >= 0.45  # the push ended before the node was told
    said = capsys.readouterr()
    assert (
        '"kind":"checkpoint"' in said.out
        and '"kind":"stopped","step":7' in said.out
        and "trainer: stopping at step 7 (the node's stop notice" in said.err
    )
    assert (tmp_path / SAVED_FILE).exists()  # the node's start script may end Ray now


def test_sigterm_and_the_notice_file_say_the_same_and_the_handler_goes_back(tmp_path: Path) -> None:
    """While it trains, SIGTERM is the trainer's notice (caught, not the end of the process); after, the
    handler before it is back. The notice file is the same notice, for processes no signal reaches."""
    before = signal.getsignal(signal.SIGTERM)
    notice = StopNotice({NOTICE_ENV: str(tmp_path / NOTICE_FILE)})
    notice.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while notice.why() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert notice.why() == "SIGTERM"
    finally:
        notice.restore()
    assert signal.getsignal(signal.SIGTERM) is before
    by_file = StopNotice({NOTICE_ENV: str(tmp_path / NOTICE_FILE)})
    (tmp_path / NOTICE_FILE).write_text("preempted\n")
    assert by_file.why() == f"the node's stop notice ({tmp_path / NOTICE_FILE})"
