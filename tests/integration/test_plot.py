"""`fleet plot`: a run's losses from its real events in a real Redis, drawn by matplotlib into a PNG that
is opened again with PIL (its size, and the colours of what was drawn), and the figure's axes as drawn."""

from __future__ import annotations

import json
from pathlib import Path

import redis
from PIL import Image
from typer.testing import CliRunner

from fleet.cli import cli
from jobs.sections.local import LocalSection
from service import plot
from service.describe import loss_curve
from state.ledger import Ledger
from state.payloads import RunPreempted, TrainEval, TrainRollback, TrainStep
from state.stages import RunState
from tests.factories import ledger_run

RUN = "261203-101010-plot01"


def _trained(client: redis.Redis[str], create: bool = True) -> None:
    """Steps 1-30 with a learning rate, evals at 10 and 20, a rollback at 25 back to 20 (steps 21-30 again
    at half the rate), then a preemption at 30 and the steps after it resumed there."""
    ledger = Ledger(client)
    if create:
        ledger.create_run(ledger_run(RUN, LocalSection(), RunState.TRAINING), [])
    drafts: list[TrainStep | TrainEval | TrainRollback | RunPreempted] = []
    drafts += [TrainStep(step=s, loss=4.0 / s, learning_rate=2e-4) for s in range(1, 26)]
    drafts += [TrainEval(step=10, eval_loss=0.6), TrainEval(step=20, eval_loss=0.4)]
    drafts.append(TrainRollback(step=25, to_step=20, reason="nan", learning_rate=1e-4))
    drafts += [TrainStep(step=s, loss=3.0 / s, learning_rate=1e-4) for s in range(21, 31)]
    preempted = dict(why="lost", preemption=1, max_preemptions=3, next_instance="tf-x-2", retry_in_s=5.0)
    drafts.append(RunPreempted(at_step=30, **preempted))
    drafts += [TrainStep(step=s, loss=3.0 / s, learning_rate=1e-4) for s in range(31, 41)]
    ledger.update_run(RUN, lambda r: list(drafts))


def test_fleet_plot_draws_the_losses_the_learning_rate_and_the_setbacks(
    env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    _trained(redis_client)
    curve = loss_curve(redis_client, RUN)
    assert len(curve.train) == 45 and curve.eval == [(10, 0.6), (20, 0.4)] and len(curve.learning_rate) == 45
    assert [(m.step, m.kind, m.note) for m in curve.marks] == [
        (25, "rollback", "rollback to 20 (nan)"),
        (30, "preemption", "preempted (1/3)"),
    ]

    target = tmp_path / "pictures" / "loss.png"
    target.parent.mkdir()
    result = CliRunner().invoke(cli, ["plot", RUN[:12], "-o", str(target), "--json"], env=env)
    assert result.exit_code == 0, result.output
    said = json.loads(result.stdout)
    assert said == {"run_id": RUN, "path": str(target), "points": {"train": 45, "eval": 2, "marks": 2}}
    with Image.open(target) as image:
        assert image.format == "PNG" and image.size == (800, 450)
        colours = {rgb for _count, rgb in image.convert("RGB").getcolors(800 * 450) or []}
    # What was drawn is there: the train line, the eval line, the rollback's and the preemption's marks.
    for colour in (plot.TRAIN, plot.EVAL, plot.MARK["rollback"], plot.MARK["preemption"]):
        assert tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5)) in colours, colour

    fig = plot.figure(curve, "t")
    ax, lr_ax = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel(), lr_ax.get_ylabel()) == ("step", "loss", "learning rate")
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["train loss", "eval loss", "learning rate"]
    # The rollback's retrace is a line of its own (steps 1-25, then 21-40), not one drawn back across it.
    train_lines = [line for line in ax.get_lines() if line.get_color() == plot.TRAIN]
    assert [(min(line.get_xdata()), max(line.get_xdata())) for line in train_lines] == [(1, 25), (21, 40)]
    assert sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--") == [25, 30]


def test_fleet_plot_says_why_it_draws_nothing(
    env: dict[str, str], redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    Ledger(redis_client).create_run(ledger_run(RUN, LocalSection(), RunState.QUEUED), [])
    result = CliRunner().invoke(cli, ["plot", RUN, "-o", str(tmp_path / "x.png")], env=env)
    assert result.exit_code == 1 and "has reported no loss yet (QUEUED)" in result.output
    assert not (tmp_path / "x.png").exists()
    _trained(redis_client, create=False)
    nowhere = tmp_path / "missing" / "x.png"
    result = CliRunner().invoke(cli, ["plot", RUN, "-o", str(nowhere)], env=env)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"cannot write {nowhere}" in " ".join(result.output.split())
