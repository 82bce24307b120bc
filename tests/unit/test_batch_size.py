"""auto_find_batch_size: the search, out-of-memory detection (CUDA's error raised on a CPU), and whole runs
under the FLEET_INJECT memory cap, which must pick a smaller micro batch than an uncapped run and train
with it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.factories import train_config, train_job
from trainer import batch_size, faults, progress, recipe
from trainer.batch_size import Trial
from trainer.errors import TrainingFailed
from trainer.tiny import build_tiny


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("cache"))


def test_search_doubles_while_it_fits_and_halves_when_the_start_does_not() -> None:
    assert batch_size.search(2, 32, lambda size: size <= 8) == (
        8,
        [Trial(2, True), Trial(4, True), Trial(8, True), Trial(16, False)],
    )
    assert batch_size.search(4, 32, lambda size: True)[0] == 32  # stops at the limit
    assert batch_size.search(16, 128, lambda size: size <= 5) == (
        4,
        [Trial(16, False), Trial(8, False), Trial(4, True)],
    )
    with pytest.raises(TrainingFailed, match=r"even with micro_batch_size 1 \(tried 4, 2, 1\)"):
        batch_size.search(4, 32, lambda size: False)
    assert batch_size.accumulation_for(4, 4, 16) == 1
    assert batch_size.accumulation_for(4, 3, 8) == 2  # 12 -> 16, the nearest at or above
    assert batch_size.accumulation_for(4, 1, 2) == 2


def test_out_of_memory_errors_are_recognised() -> None:
    import torch

    assert batch_size.is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert batch_size.is_oom(
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: "
            "can't allocate memory: you tried to allocate 1099511627776 bytes"
        )
    )
    assert batch_size.is_oom(MemoryError())
    assert not batch_size.is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_a_cuda_out_of_memory_error_in_a_trial_means_too_big() -> None:
    import torch

    class Model(torch.nn.Module):  # type: ignore[misc]  # torch is not type-checked here
        """Raises CUDA's OOM error for batches over 6 rows, and another RuntimeError for empty ones."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3))

        def forward(self, input_ids: Any) -> Any:
            if input_ids.shape[0] > 6:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
            if input_ids.shape[0] == 0:
                raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
            return SimpleNamespace(loss=(self.weight * input_ids.float().sum()).sum())

    model, cpu = Model(), torch.device("cpu")

    def fits(rows: int) -> bool:
        return batch_size.fits(model, {"input_ids": torch.ones(rows, 2)}, None, cpu)

    assert fits(6)
    assert model.weight.grad is None  # the trial's gradients are dropped
    assert not fits(7)
    with pytest.raises(RuntimeError, match="shapes"):  # not an OOM: not swallowed
        fits(0)
    assert batch_size.search(3, 24, fits) == (6, [Trial(3, True), Trial(6, True), Trial(12, False)])


@pytest.mark.parametrize(
    ("cap_mb", "expected_size", "expected_accumulation", "expected_tried"),
    [
        # about 1.3 MiB of activations per example of the longest (71 tokens): 4 fit in 8 MiB, 8 do not
        (None, 32, 1, [(4, True), (8, True), (16, True), (32, True)]),  # up to 8x the configured 4
        (8, 4, 1, [(4, True), (8, False)]),
        (3, 2, 2, [(4, False), (2, True)]),  # below the configured size: accumulation keeps 4 per step
    ],
)
def test_auto_find_batch_size_under_a_memory_cap(
    tmp_path: Path,
    model_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    cap_mb: int | None,
    expected_size: int,
    expected_accumulation: int,
    expected_tried: list[tuple[int, bool]],
) -> None:
    if cap_mb is not None:
        monkeypatch.setenv(faults.ENV_VAR, f"memory_cap_mb:{cap_mb}")
    config = train_config(auto_find_batch_size=True, max_steps=2, eval_steps=None, save_steps=2)
    job = train_job(tmp_path, config)
    metrics = recipe.run(job, model_path)

    lines = list(progress.parse(capsys.readouterr().out))
    assert lines[0] == {
        "kind": "batch_size",
        "micro_batch_size": expected_size,
        "gradient_accumulation_steps": expected_accumulation,
        "tried": [{"size": size, "fits": fits} for size, fits in expected_tried],
    }
    # 792 training examples: 2 steps of `expected_size` x `expected_accumulation` examples each
    batches = -(-792 // expected_size)
    assert metrics["epoch"] == round(2 * expected_accumulation / batches, 4)
    state = (Path(job.work_dir) / "checkpoints" / "step-2" / "trainer_state.json").read_text()
    assert f'"micro_batch_size": {expected_size},' in state
