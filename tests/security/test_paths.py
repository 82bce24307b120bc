"""Issue 19, findings 1, 2 and 12a: the local files a job names stay under its directory or a data root.

A job may read (and, for a rented node, ship) only regular files under its own directory or under
FLEET_DATA_ROOTS, after symlinks, never /proc, /dev or /sys; `data_files` never climb out of their
dataset, and nothing is written outside ship/; a job file that is a FIFO is refused at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError, Problem
from fleet.cli import cli
from jobs.paths import Confinement
from jobs.shipping import ship_datasets
from jobs.spec import LoadedJob, load_job, parse_job
from service.sweep_load import load_sweep
from tests.factories import TINY_DATA
from trainer.config import AxolotlConfig

REPO = Path(__file__).resolve().parents[2]
HEAD = "base_model: trainfleet/tiny-llama\n"
RUNPOD = "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n"


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """A job directory (with data beside the job) and, next to it, a directory the job may not read."""
    job_dir, outside = tmp_path / "job", tmp_path / "outside"
    (job_dir / "data").mkdir(parents=True)
    outside.mkdir()
    (job_dir / "data" / "train.jsonl").write_bytes(TINY_DATA.read_bytes())
    (outside / "secret.jsonl").write_text('{"text": "the fleet\'s secret"}\n')
    return job_dir, outside


def job_file(job_dir: Path, datasets: str, extra: str = "") -> Path:
    path = job_dir / "job.yml"
    path.write_text(HEAD + "datasets:\n" + datasets + extra)
    return path


def refused(path: Path, **kwargs: object) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        load_job(path, **kwargs)  # type: ignore[arg-type]
    return info.value.problems


def only(problems: list[Problem], key: str, line: int) -> Problem:
    found = [p for p in problems if (p.path, p.line) == (key, line)]
    assert found, problems
    return found[0]


# --- finding 1: dataset paths ---------------------------------------------------------------------------


def test_an_absolute_dataset_path_outside_is_refused(places: tuple[Path, Path]) -> None:
    job_dir, outside = places
    for written in (str(outside / "secret.jsonl"), "/etc/passwd", str(outside / "no-such.jsonl")):
        path = job_file(job_dir, f"  - path: {written}\n    type: alpaca\n")
        problem = only(refused(path), "datasets[0].path", 3)
        assert "is outside the job's directory" in problem.message and "FLEET_DATA_ROOTS" in problem.message
    # the same file is refused even for the runpod provider, whose shipping would have copied it
    path = job_file(job_dir, f"  - path: {outside / 'secret.jsonl'}\n    type: alpaca\n", RUNPOD)
    assert only(refused(path), "datasets[0].path", 3)


def test_a_dotdot_dataset_path_is_refused(places: tuple[Path, Path]) -> None:
    job_dir, _ = places
    for written in ("../outside/secret.jsonl", "data/../../outside/secret.jsonl", "../" * 12 + "etc/passwd"):
        path = job_file(job_dir, f"  - path: {written}\n    type: alpaca\n")
        assert "is outside" in only(refused(path), "datasets[0].path", 3).message


def test_a_symlink_that_leads_out_is_refused(places: tuple[Path, Path]) -> None:
    job_dir, outside = places
    (job_dir / "data" / "link.jsonl").symlink_to(outside / "secret.jsonl")
    (job_dir / "linked").symlink_to(outside)
    (job_dir / "data" / "inner").symlink_to(outside)  # a link inside a dataset directory
    for i, written in enumerate(("data/link.jsonl", "linked/secret.jsonl", "data")):
        path = job_file(job_dir, f"  - path: {written}\n    type: alpaca\n")
        problem = only(refused(path), "datasets[0].path", 3)
        assert "leads outside" in problem.message, (i, problem)
        assert str(outside) not in problem.message  # the link's target is not told
    (job_dir / "data" / "inner").unlink()
    (job_dir / "data" / "link.jsonl").unlink()
    os.mkfifo(job_dir / "data" / "pipe.jsonl")  # nor a FIFO inside a directory: it would block the copy
    path = job_file(job_dir, "  - path: data\n    type: alpaca\n")
    assert "not a regular file" in only(refused(path), "datasets[0].path", 3).message


def test_proc_dev_and_sys_are_never_read_even_under_a_root(places: tuple[Path, Path]) -> None:
    job_dir, _ = places
    for written in ("/proc/self/environ", "/dev/zero", "/sys/kernel/notes"):
        path = job_file(job_dir, f"  - path: {written}\n    type: alpaca\n")
        problem = only(refused(path, data_roots=(Path("/"),)), "datasets[0].path", 3)
        assert "never read" in problem.message
    (job_dir / "environ.jsonl").symlink_to("/proc/self/environ")
    path = job_file(job_dir, "  - path: environ.jsonl\n    type: alpaca\n")
    assert only(refused(path, data_roots=(Path("/"),)), "datasets[0].path", 3)


def test_an_absolute_deepspeed_json_outside_is_neither_read_nor_shipped(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    job_dir, outside = places
    (outside / "zero2.json").write_text("{}")
    axolotl = "trainer: axolotl\nadapter: lora\n"
    data = "  - path: data/train.jsonl\n    type: alpaca\n"
    local = job_file(job_dir, data, f"{axolotl}deepspeed: {outside / 'zero2.json'}\n")
    assert "is outside" in only(refused(local), "deepspeed", 7).message  # a local node would read it
    proc = job_file(job_dir, data, f"{axolotl}deepspeed: /proc/self/environ\n{RUNPOD}")
    assert "never read" in only(refused(proc), "deepspeed", 7).message
    # on a rented node an absolute path is the image's own file: kept, and never copied from here
    rented = load_job(job_file(job_dir, data, f"{axolotl}deepspeed: {outside / 'zero2.json'}\n{RUNPOD}"))
    assert isinstance(rented.spec.train, AxolotlConfig)
    shipped = ship_datasets(rented.spec.train, rented.source, tmp_path / "ship", rented.paths)
    assert (shipped.model_extra or {})["deepspeed"] == str(outside / "zero2.json")
    assert not (tmp_path / "ship" / "deepspeed").exists()


def test_shipping_checks_again_what_it_copies(places: tuple[Path, Path], tmp_path: Path) -> None:
    """Defence in depth: a config that skipped validation (or a file swapped since) is still refused."""
    job_dir, outside = places
    job = load_job(job_file(job_dir, "  - path: data/train.jsonl\n    type: alpaca\n", RUNPOD))
    sneaky = job.spec.train.model_copy(
        update={"datasets": [job.spec.train.datasets[0].model_copy(update={"path": str(outside)})]}
    )
    with pytest.raises(ConfigError) as info:
        ship_datasets(sneaky, job.source, tmp_path / "ship", job.paths)
    assert info.value.problems[0].path == "datasets[0].path"
    assert not (tmp_path / "ship").exists()


# --- finding 2: data_files ------------------------------------------------------------------------------


def test_data_files_that_climb_out_are_refused_and_nothing_is_written_outside_ship(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    job_dir, _ = places
    (job_dir / "data" / "sub").mkdir()
    deep = "../" * 8 + "escaped.jsonl"
    path = job_file(
        job_dir,
        f"  - path: data/sub\n    type: alpaca\n    data_files:\n      - {deep}\n",
        "trainer: axolotl\nadapter: lora\n" + RUNPOD,
    )
    problem = only(refused(path), "datasets[0].data_files[0]", 6)
    assert "inside the dataset's directory" in problem.message
    # and shipping, handed such a config anyway, writes nothing outside ship/
    (job_dir / "data" / "a" / "b" / "c").mkdir(parents=True)
    (job_dir / "data" / "a" / "b" / "c" / "a.jsonl").write_bytes(TINY_DATA.read_bytes())
    ok = load_job(job_file(job_dir, "  - path: data/a/b/c\n    type: alpaca\n", RUNPOD))
    # the source, job/x.jsonl, is the job's own; its copy, ship/datasets/0/c/../../../../x.jsonl, is not
    ds = ok.spec.train.datasets[0].model_copy(update={"data_files": ["a.jsonl", "../" * 4 + "x.jsonl"]})
    (job_dir / "x.jsonl").write_text("{}\n")
    ship = tmp_path / "deep" / "ship"
    with pytest.raises(ConfigError) as info:
        ship_datasets(ok.spec.train.model_copy(update={"datasets": [ds]}), ok.source, ship, ok.paths)
    assert "would be written outside" in info.value.problems[0].message
    assert not ship.exists()  # refused before anything was copied
    assert not (tmp_path / "deep" / "x.jsonl").exists() and not (ship.parent / "x.jsonl").exists()


def test_absolute_data_files_are_an_error_not_a_traceback(places: tuple[Path, Path], tmp_path: Path) -> None:
    job_dir, outside = places
    path = job_file(
        job_dir, f"  - path: data\n    type: alpaca\n    data_files: {outside / 'secret.jsonl'}\n", RUNPOD
    )
    assert "inside the dataset's directory" in only(refused(path), "datasets[0].data_files", 5).message
    ok = load_job(job_file(job_dir, "  - path: data\n    type: alpaca\n", RUNPOD))
    ds = ok.spec.train.datasets[0].model_copy(update={"data_files": str(outside / "secret.jsonl")})
    with pytest.raises(ConfigError) as info:  # not ValueError from relative_to
        ship_datasets(
            ok.spec.train.model_copy(update={"datasets": [ds]}), ok.source, tmp_path / "s", ok.paths
        )
    assert info.value.problems[0].path == "datasets[0].path"


# --- finding 12a: a job file that is not a regular file --------------------------------------------------


def test_a_fifo_job_file_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "job.yml"
    os.mkfifo(fifo)
    env = {**os.environ, "FLEET_HOME": str(tmp_path / "home"), "FLEET_SETTINGS_FILE": str(tmp_path / "none")}
    (tmp_path / "none").write_text("{}\n")
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "fleet", "validate", str(fifo)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,  # before the fix: blocked in open() for ever
    )
    assert (
        done.returncode == 1 and "a FIFO, device or socket, not a regular file" in done.stdout + done.stderr
    )
    assert time.perf_counter() - started < 30
    # a sweep file too (read in-process: a thread, so that a hang fails the test instead of blocking it)
    result: list[object] = []
    (tmp_path / "sweep").mkdir()
    job = job_file(tmp_path / "sweep", "  - path: tatsu-lab/alpaca\n")

    def read() -> None:
        try:
            result.append(load_sweep(job, fifo))
        except ConfigError as exc:
            result.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():
        with open(fifo, "w"):  # unblock the reader before failing
            pass
    assert not reader.is_alive() and result and isinstance(result[0], ConfigError), result
    assert "not a regular file" in str(result[0].problems)


# --- what stays allowed ---------------------------------------------------------------------------------


def test_allowed_paths_still_work(places: tuple[Path, Path], tmp_path: Path) -> None:
    job_dir, outside = places
    beside = load_job(job_file(job_dir, "  - path: data/train.jsonl\n    type: alpaca\n"))
    assert beside.spec.train.datasets[0].path == str(job_dir / "data" / "train.jsonl")
    absolute = load_job(job_file(job_dir, f"  - path: {job_dir / 'data'}\n    type: alpaca\n"))
    assert absolute.spec.train.datasets[0].path == str(job_dir / "data")
    hub = load_job(job_file(job_dir, "  - path: tatsu-lab/alpaca\n    data_files: [train.jsonl]\n"))
    assert hub.spec.train.datasets[0].path == "tatsu-lab/alpaca"
    # under a data root, through the setting as an operator writes it (os.pathsep-separated)
    settings = tmp_path / "settings.yml"
    settings.write_text("{}\n")
    env = {"FLEET_HOME": str(tmp_path / "h"), "FLEET_SETTINGS_FILE": str(settings)}
    path = job_file(job_dir, f"  - path: {outside / 'secret.jsonl'}\n    type: completion\n")
    rooted = CliRunner().invoke(
        cli,
        ["validate", "--no-axolotl-check", str(path)],
        env={**env, "FLEET_DATA_ROOTS": f"/nowhere{os.pathsep}{outside}"},
    )
    assert rooted.exit_code == 0, rooted.output
    assert CliRunner().invoke(cli, ["validate", "--no-axolotl-check", str(path)], env=env).exit_code == 1
    # shipped from a root, read back the same
    job = load_job(
        job_file(job_dir, f"  - path: {outside}\n    type: completion\n", RUNPOD), data_roots=(outside,)
    )
    shipped = ship_datasets(job.spec.train, job.source, tmp_path / "ship", job.paths)
    assert shipped.datasets[0].path == "datasets/0/outside"
    assert (tmp_path / "ship" / "datasets/0/outside/secret.jsonl").read_text() == (
        outside / "secret.jsonl"
    ).read_text()


def parsed(text: str, base_dir: Path, paths: Confinement) -> LoadedJob:
    return parse_job((HEAD + text).encode(), source="attached.yml", base_dir=base_dir, paths=paths)


def test_an_attachment_reads_only_under_the_data_roots_and_a_git_job_its_checkout(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    job_dir, _ = places
    text = "datasets:\n  - path: data/train.jsonl\n    type: alpaca\n"
    # the bot: relative paths looked up in the configs directory, allowed only under a root
    with pytest.raises(ConfigError) as info:
        parsed(text, job_dir, Confinement(None))
    assert "an attached job has no directory of its own" in info.value.problems[0].message
    assert parsed(text, job_dir, Confinement(None, (job_dir / "data",))).spec.train.datasets[0].path
    # git: a job in configs/ may name the checkout's data/, not what is beside the checkout
    configs = job_dir / "configs"
    configs.mkdir()
    up = "datasets:\n  - path: ../data/train.jsonl\n    type: alpaca\n"
    assert parsed(up, configs, Confinement(job_dir)).spec.train.datasets[0].path.endswith("data/train.jsonl")
    with pytest.raises(ConfigError):
        parsed("datasets:\n  - path: ../../outside/secret.jsonl\n", configs, Confinement(job_dir))


# --- the other keys a local node reads as paths (finding 1: "every local path a job names") ----------------


def axolotl_job(job_dir: Path, base_model: str, extra: str, section: str = "") -> Path:
    path = job_dir / "job.yml"
    path.write_text(
        f"trainer: axolotl\nbase_model: {base_model}\ndatasets:\n"
        f"  - path: data/train.jsonl\n    type: alpaca\nadapter: lora\n{extra}{section}"
    )
    return path


def test_a_local_node_is_given_no_path_outside_the_jobs_places(places: tuple[Path, Path]) -> None:
    job_dir, outside = places
    said = only(refused(axolotl_job(job_dir, str(outside), "")), "base_model", 2).message
    assert str(job_dir) in said and "FLEET_DATA_ROOTS" in said
    for key, value in {
        "lora_model_dir": "../../outside",
        "dataset_prepared_path": "~/prepared",
        "chat_template_jinja": "/proc/self/environ",
        "resume_from_checkpoint": str(outside),
    }.items():
        only(refused(axolotl_job(job_dir, "trainfleet/tiny-llama", f"{key}: {value}\n")), key, 7)
    (job_dir / "model").mkdir()
    (job_dir / "model" / "config.json").write_text("{}")
    (job_dir / "model-link").symlink_to(outside, target_is_directory=True)
    only(refused(axolotl_job(job_dir, str(job_dir / "model-link"), "")), "base_model", 2)


def test_paths_inside_the_job_and_a_rented_nodes_own_paths_pass(places: tuple[Path, Path]) -> None:
    job_dir, _outside = places
    (job_dir / "model").mkdir()
    (job_dir / "model" / "config.json").write_text("{}")
    extra = "lora_model_dir: outputs/adapter\ndataset_prepared_path: last_run_prepared\n"
    load_job(axolotl_job(job_dir, str(job_dir / "model"), extra))
    # On a rented node an absolute path is the node's own (its image, its volume): the fleet never reads it.
    load_job(axolotl_job(job_dir, "trainfleet/tiny-llama", "lora_model_dir: /workspace/adapter\n", RUNPOD))
