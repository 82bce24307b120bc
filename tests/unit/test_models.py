"""The state enums, and how events read in `fleet logs`."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from fleet.live import LiveView
from jobs.sections import ProviderName
from providers.runpod.section import RunPodSection
from service.describe import describe
from state.models import InstanceState, Run
from state.payloads import Event, EventType
from state.stages import RunState, Stage
from tests.factories import job_spec


def test_run_states_map_to_their_stage_and_terminality() -> None:
    assert RunState.QUEUED.stage == Stage.PROVISION
    assert RunState.TRAINING.stage == Stage.TRAIN
    assert [s for s in RunState if s.is_terminal()] == [
        RunState.SUCCEEDED,
        RunState.FAILED,
        RunState.CANCELLED,
    ]
    assert all(s.stage is None for s in RunState if s.is_terminal())
    assert {s for s in InstanceState if s.is_terminal()} == {InstanceState.TERMINATED, InstanceState.LOST}


def test_instance_name_is_deterministic() -> None:
    run = Run(
        run_id="261129-1-ab",
        provider="local",
        source="x",
        spec=job_spec(),
        run_dir="/r",
        output_dir="/r/o",
        attempt=2,
    )
    assert run.instance_name == "tf-261129-1-ab-2"
    assert run.num_nodes == 1 and run.instance_names == ["tf-261129-1-ab-2"]


def test_a_clusters_instances_are_named_by_node_head_first() -> None:
    run = Run(
        run_id="261129-1-ab",
        provider="runpod",
        source="x",
        spec=job_spec(RunPodSection(num_nodes=3, network_volume_id="vol")),
        run_dir="/r",
        output_dir="/r/o",
    )
    assert run.num_nodes == 3
    assert run.instance_names == ["tf-261129-1-ab-1-0", "tf-261129-1-ab-1-1", "tf-261129-1-ab-1-2"]
    assert run.instance_name == "tf-261129-1-ab-1-0"  # the head, which the fleet talks to
    assert run.instance_names_of(2)[1] == "tf-261129-1-ab-2-1"


def test_an_entry_scripts_end_reads_as_one_line_with_its_last_words() -> None:
    data = {"ray_job": "r-1-entry", "status": "FAILED", "exit_code": 3, "seconds": 1.5}
    output = "setting up\n\nmissing thing: oops\n\n"
    event = Event(id="r-2", type=EventType.PREPARE_ENTRY, run_id="r", time=0, data={**data, "output": output})
    assert describe(event) == (
        "00:00:00 prepare.entry          ray_job=r-1-entry status=FAILED exit_code=3 seconds=1.5 "
        "output=…missing thing: oops"
    )
    quiet = Event(id="r-3", type=EventType.PREPARE_ENTRY, run_id="r", time=0, data={**data, "output": ""})
    assert describe(quiet).endswith("exit_code=3 seconds=1.5")


def test_describe_and_live_view_render() -> None:
    event = Event(
        id="r-1", type=EventType.TRAIN_EVAL, run_id="r", time=0, data={"step": 20, "eval_loss": 1.23456}
    )
    assert describe(event) == "00:00:00 train.eval             step=20 eval_loss=1.235"
    run = Run(run_id="r", provider="local", source="x", spec=job_spec(), run_dir="/r", output_dir="/r/o")
    run.state = RunState.TRAINING
    run.stage(Stage.PROVISION).started, run.stage(Stage.PROVISION).ended = 1.0, 3.5
    run.stage(Stage.TRAIN).started = 4.0
    run.progress.step, run.progress.total_steps, run.progress.loss = 5, 10, 2.0
    view = LiveView(run)
    view.update(run, event)
    from rich.console import Console

    console = Console(width=100, record=True)
    console.print(view.render())
    text = console.export_text()
    assert "provision  done" in text and "2.5s" in text and "train      running" in text
    assert "step 5/10" in text and "eval_loss" in text


def test_live_view_marks_the_stage_a_run_ended_in() -> None:
    from rich.console import Console

    run = Run(run_id="r", provider="local", source="x", spec=job_spec(), run_dir="/r", output_dir="/r/o")
    run.stage(Stage.PROVISION).started, run.stage(Stage.PROVISION).ended = 1.0, 2.0
    run.stage(Stage.PREPARE).started, run.stage(Stage.PREPARE).ended = 2.0, 4.0
    run.state = RunState.CANCELLED
    console = Console(width=100, record=True)
    console.print(LiveView(run).render())
    text = console.export_text()
    assert "provision  done" in text and "prepare    stopped" in text and "train      waiting" in text


def test_the_stages_follow_one_order() -> None:
    assert [s.following for s in (Stage.PROVISION, Stage.PREPARE, Stage.TRAIN)] == [
        Stage.PREPARE,
        Stage.TRAIN,
        Stage.FINALIZE,
    ]
    with pytest.raises(ValueError, match="last stage"):
        _ = Stage.FINALIZE.following


def test_a_run_holds_its_job_typed() -> None:
    """The ledger's Run keeps the JobSpec, its provider and its progress as models, through JSON."""
    spec = job_spec(RunPodSection(num_nodes=2, network_volume_id="vol"))
    run = Run(run_id="r", provider="runpod", source="x", spec=spec, run_dir="/r", output_dir="/r/o")
    run.progress.step, run.progress.cluster = 3, ["n1"]
    again = Run.model_validate_json(run.model_dump_json())
    assert again == run and again.spec == spec and isinstance(again.spec.section, RunPodSection)
    assert again.provider == ProviderName("runpod") and again.num_nodes == 2 and again.progress.step == 3
    with pytest.raises(ValidationError, match="not the job's"):
        Run(run_id="r", provider="local", source="x", spec=spec, run_dir="/r", output_dir="/r/o")
    with pytest.raises(ValidationError):
        run.progress.step = "three"  # type: ignore[assignment]  # assignments are validated


def test_a_run_an_older_ledger_wrote_still_loads() -> None:
    """Before the ledger was typed, no origin was `{}` and progress carried `pushed` beside `hub`."""
    older = Run(run_id="r", provider="local", source="x", spec=job_spec(), run_dir="/r", output_dir="/r/o")
    text = older.model_dump(mode="json")
    text.update(origin={}, progress={"step": 7, "pushed": True, "hub": {"repo_id": "me/tiny", "url": "u"}})
    loaded = Run.model_validate_json(json.dumps(text))
    assert loaded.origin is None and loaded.progress.step == 7
    assert loaded.progress.pushed and loaded.progress.hub is not None and loaded.progress.hub.url == "u"
