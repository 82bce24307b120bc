"""A run's training as a picture: train and eval loss against step, the learning rate on a second axis, its
rollbacks and preemptions marked. `fleet plot` writes it; the Discord notifier attaches it to a run's result
and failure messages.

matplotlib's object API (a `Figure` of its own, no pyplot): no global state and no GUI backend, so the
notifier's lanes may draw two runs at once; it is imported only when a picture is drawn.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from service.describe import LossCurve

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SIZE_IN = (8.0, 4.5)
DPI = 100  # 800 x 450 pixels: readable inline in Discord and in a terminal's image viewer
TRAIN, EVAL, LR = "#1f77b4", "#ff7f0e", "#7f7f7f"
MARK = {"rollback": "#d62728", "preemption": "#9467bd"}


def has_points(curve: LossCurve) -> bool:
    return bool(curve.train or curve.eval)


def segments(points: list[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    """Points cut where the step goes back (a rollback, a resume from a checkpoint): each piece is drawn as
    a line of its own, so the picture shows the retrace instead of a line drawn back across it."""
    pieces: list[list[tuple[int, float]]] = []
    for point in points:
        if not pieces or point[0] <= pieces[-1][-1][0]:
            pieces.append([])
        pieces[-1].append(point)
    return pieces


def figure(curve: LossCurve, title: str) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    for label, points, color, marker in (
        ("train loss", curve.train, TRAIN, None),
        ("eval loss", curve.eval, EVAL, "o"),
    ):
        for i, piece in enumerate(segments(points)):
            steps, values = zip(*piece, strict=True)
            ax.plot(steps, values, color=color, marker=marker, markersize=4, label=label if i == 0 else None)
    handles, labels = ax.get_legend_handles_labels()
    if curve.learning_rate:
        lr_ax = ax.twinx()
        lr_ax.set_ylabel("learning rate")
        for i, piece in enumerate(segments(curve.learning_rate)):
            steps, values = zip(*piece, strict=True)
            lr_ax.plot(steps, values, color=LR, linestyle=":", label="learning rate" if i == 0 else None)
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        more_handles, more_labels = lr_ax.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    for mark in curve.marks:
        ax.axvline(mark.step, color=MARK[mark.kind], linestyle="--", linewidth=1)
        ax.annotate(  # along its line, from the top: marks side by side never write over each other
            mark.note,
            (mark.step, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-2, -4),
            textcoords="offset points",
            rotation=90,
            ha="right",
            va="top",
            color=MARK[mark.kind],
            fontsize=8,
        )
    if handles:  # under the axes, where it hides no line
        fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    return fig


def png(curve: LossCurve, title: str) -> bytes:
    """The picture as PNG bytes."""
    buffer = io.BytesIO()
    figure(curve, title).savefig(buffer, format="png")
    return buffer.getvalue()
