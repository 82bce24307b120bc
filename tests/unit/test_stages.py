"""state.stages.STAGES, the one stage table: every stage has its facts there, each fact is something the
fleet has (a run state, a failure reason, a settings field, a module with the stage's task), and the
per-stage tables elsewhere are what it says."""

from __future__ import annotations

import importlib

from broker.app import TASK_MODULES, app, time_limits
from broker.queues import QUEUES
from core.settings import Settings
from state.stages import STAGES, RunState, Stage
from workers import watcher


def test_every_stage_has_its_facts_and_each_names_what_exists() -> None:
    assert list(STAGES) == list(Stage)
    assert len({facts.state for facts in STAGES.values()}) == len(Stage)
    for stage, facts in STAGES.items():
        assert facts.time_limit in Settings.model_fields, facts.time_limit
        module = importlib.import_module(facts.module)
        assert module.__name__ in TASK_MODULES and stage.task_name in app.tasks
        assert app.tasks[stage.task_name].__module__ == module.__name__
        assert stage.value in QUEUES


def test_the_other_tables_read_it() -> None:
    settings = Settings(train_time_limit_s=77, time_limit_grace_s=5)
    assert time_limits(settings)[Stage.TRAIN.task_name] == (77, 82)
    for stage, facts in STAGES.items():
        assert facts.state.stage == stage  # a run in the stage's state is the stage's to act on
    assert RunState.QUEUED.stage == Stage.PROVISION
    assert all(state.stage is None for state in RunState if state.is_terminal())
    # The watcher relays a job's lines with its stage module's relay.
    with_relay = {s for s, f in STAGES.items() if hasattr(importlib.import_module(f.module), "relay")}
    assert with_relay == {Stage.PREPARE, Stage.TRAIN}
    assert all(watcher.relay_of(s) is importlib.import_module(STAGES[s].module).relay for s in with_relay)
