"""trainer.lines, the node protocol typed once: every line the trainer prints is read back by the fleet
into an event whose payload is the same model (its every field as the trainer gave it, NaN included), a
field the model does not declare is refused where the trainer writes it, and a line's extra keys from the
node still reach the event."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from state.models import RunProgress
from state.payloads import PAYLOADS, HubPush, Payload
from trainer import lines, progress
from workers.node_job import node_record
from workers.stages.train import RELAYED

SAMPLES: list[lines.Line] = [
    lines.Fetched(
        model_path="/n/cache/tiny",
        examples=8,
        dataset_files=["/n/data/a.jsonl"],
        download=lines.Download(
            bytes=10, files=1, seconds=0.5, repos=[lines.Repo(repo_id="me/m", type="model", sha="s")]
        ),
    ),
    lines.Started(
        total_steps=4, num_workers=2, nodes=["a", None], num_nodes=1, python="/n/py", precision="float32"
    ),
    lines.Step(step=2, total_steps=4, loss=float("nan"), learning_rate=1e-4, epoch=0.5),
    lines.Eval(step=2, eval_loss=1.25),
    lines.Checkpoint(step=2, path="/n/ck/2", hub="checkpoint-2"),
    lines.Resumed(step=2, total_steps=4, path="/n/ck/2", source="ray"),
    lines.Rollback(step=3, to_step=2, reason="high_loss", loss=9.5, learning_rate=5e-5, rollbacks=1),
    lines.Stopped(step=17, why="the node's stop notice (/tmp/node/stop-notice)", saved_in_s=0.8),
    lines.BatchSize(
        micro_batch_size=4, gradient_accumulation_steps=2, tried=[lines.Trial(size=8, fits=False)]
    ),
    lines.Finished(metrics={"train_loss": 1.0, "global_step": 4}, output_dir="/n/out"),
    lines.Pending(
        workers=2,
        per_worker={"CPU": 1.0},
        nodes=[lines.PendingNode(node_id="n1", total={"CPU": 1.0}, available={"CPU": 0.0}, fit=1)],
        waited_s=3.0,
        report=1,
    ),
    lines.WandbUnavailable(status="unavailable", error="CommError: 401"),
    lines.Pushed(repo_id="me/tiny", commit="abc", url="https://hub/me/tiny"),
]


def payload_of(line: lines.Line) -> type[Payload]:
    """The fleet's event payload for `line`: the one class of the registry built on its model."""
    (found,) = [p for p in PAYLOADS.values() if type(line) in p.__mro__]
    return found


def test_every_line_model_has_a_sample_here() -> None:
    """A new line model must join SAMPLES, so that the round trip below covers it."""
    declared = {c for c in vars(lines).values() if isinstance(c, type) and issubclass(c, lines.Line)}
    assert declared - {lines.Line} == {type(s) for s in SAMPLES}


@pytest.mark.parametrize("line", SAMPLES, ids=lambda s: s.kind.value)
def test_the_fleet_reads_a_line_into_the_same_model(
    line: lines.Line, capsys: pytest.CaptureFixture[str]
) -> None:
    lines.emit(line)
    (record,) = progress.parse(capsys.readouterr().out)
    assert record["kind"] == line.kind
    payload = node_record(payload_of(line).type, record)
    assert isinstance(payload, type(line))
    sent, read = lines.fields(line), lines.fields(payload)
    if isinstance(line, lines.Step):  # NaN is not equal to itself: the loss is checked apart
        assert math.isnan(read.pop("loss")) and math.isnan(sent.pop("loss"))
    assert read == sent


def test_a_field_the_model_does_not_declare_is_refused_where_the_trainer_writes_it() -> None:
    with pytest.raises(ValidationError, match="stpe"):
        lines.Step(step=1, stpe=2)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="step"):
        lines.Step(loss=1.0)  # type: ignore[call-arg]


def test_a_lines_extra_keys_from_the_node_reach_its_event() -> None:
    payload = node_record(payload_of(SAMPLES[2]).type, {"kind": "step", "step": 1, "tokens_per_s": 9.5})
    assert payload is not None and payload.wire() == {"step": 1, "tokens_per_s": 9.5}


def test_the_fleets_tables_come_from_the_line_models() -> None:
    """The train stage relays each of its lines as the event built on that line's model, and the ledger's
    progress keeps every field of a STEP line but the kind."""
    assert {p.kind for p in RELAYED} == {
        s.kind for s in SAMPLES if not isinstance(s, lines.Fetched | lines.Pushed)
    }
    assert set(lines.Step.model_fields) <= set(RunProgress.model_fields)
    assert issubclass(HubPush, lines.Pushed)
