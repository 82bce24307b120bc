"""core.errors.clipped: a long failure message keeps what failed (its first line) and why (its last lines,
where a traceback names its cause), each whole, within the limit."""

from __future__ import annotations

from core.errors import clipped

TRACEBACK = (
    "train job FAILED: Job entrypoint command failed with exit code 1\n"
    + "\n".join(f'  File "/node/trainer/train.py", line {i}, in step' for i in range(200))
    + "\nValueError: eval_steps must be positive"
)


def test_a_short_message_is_whole() -> None:
    assert clipped("fetch job FAILED: no such model", 500) == "fetch job FAILED: no such model"


def test_a_long_message_keeps_its_first_line_and_its_cause_whole() -> None:
    for limit in (500, 2000):
        shown = clipped(TRACEBACK, limit)
        lines = shown.splitlines()
        assert len(shown) <= limit
        assert lines[0] == "train job FAILED: Job entrypoint command failed with exit code 1"
        assert lines[1] == "…" and lines[-1] == "ValueError: eval_steps must be positive"
        assert all(line in TRACEBACK.splitlines() for line in lines[2:])  # whole lines only
    small = clipped(TRACEBACK, 120)  # the first line gets a third of it, the cause the rest
    assert small.startswith("train job FAILED: Job") and small.endswith(
        "\nValueError: eval_steps must be positive"
    )


def test_one_long_line_keeps_its_start_and_its_end() -> None:
    shown = clipped("a" * 500 + "b" * 500, 100)
    first, gap, last = shown.split("\n")
    assert len(shown) <= 100 and gap == "…"
    assert set(first) == {"a"} and set(last) == {"b"} and len(last) > 50
