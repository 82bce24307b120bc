"""jobs.shipping: a rented node gets a snapshot of the job's local datasets, at paths relative to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from jobs import shipping
from jobs.paths import Confinement
from tests.factories import TINY_DATA, train_config
from trainer.data import load_records


def test_files_and_directories_travel_and_read_the_same(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(TINY_DATA.read_bytes())
    (folder / "notes.txt").write_text("not data")
    config = train_config(
        datasets=[
            {"path": str(TINY_DATA), "type": "alpaca"},
            {"path": str(folder), "type": "alpaca"},
            {"path": "tatsu-lab/alpaca", "type": "alpaca"},  # a hub id travels as it is
        ]
    )
    ship = tmp_path / "ship"
    shipped = shipping.ship_datasets(config, "job.yml", ship, Confinement(tmp_path, (TINY_DATA.parent,)))

    paths = [ds.path for ds in shipped.datasets]
    assert paths == [f"datasets/0/{TINY_DATA.name}", "datasets/1/folder", "tatsu-lab/alpaca"]
    assert sorted(p.relative_to(ship).as_posix() for p in ship.rglob("*") if p.is_file()) == [
        "datasets/0/" + TINY_DATA.name,
        "datasets/1/folder/a.jsonl",
    ]
    local = load_records(config.datasets[:2])
    assert load_records(shipped.datasets[:2], base_dir=ship) == local  # the node reads the same examples
    assert config.datasets[0].path == str(TINY_DATA)  # the caller's config is left alone


def test_a_local_model_or_too_much_data_is_refused_with_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = train_config(base_model=str(tmp_path))
    allowed = Confinement(tmp_path, (TINY_DATA.parent,))
    with pytest.raises(ConfigError) as err:
        shipping.ship_datasets(config, "job.yml", tmp_path / "ship", allowed)
    assert "base_model" in str(err.value) and "hub model id" in str(err.value)

    monkeypatch.setattr(shipping, "SHIP_LIMIT_BYTES", TINY_DATA.stat().st_size - 1)
    with pytest.raises(ConfigError) as err:
        shipping.ship_datasets(train_config(), "job.yml", tmp_path / "ship", allowed)
    assert "datasets" in str(err.value) and "HF Hub" in str(err.value)
    assert not (tmp_path / "ship").exists()  # nothing copied when refused


def test_axolotls_path_json_form_validates_ships_and_reads_the_same(tmp_path: Path) -> None:
    from jobs.spec import load_job

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_bytes(TINY_DATA.read_bytes())
    job = tmp_path / "job.yml"
    job.write_text(
        "base_model: trainfleet/tiny-llama\nadapter: lora\n"
        "datasets:\n  - path: json\n    data_files: data/train.jsonl\n    type: alpaca\n"
    )
    loaded = load_job(job)
    (entry,) = loaded.spec.train.datasets
    assert entry.path == "json" and entry.data_files == str(tmp_path / "data" / "train.jsonl")

    ship = tmp_path / "ship"
    shipped = shipping.ship_datasets(loaded.spec.train, "job.yml", ship, loaded.paths)
    assert shipped.datasets[0].data_files == "datasets/0/train.jsonl"
    assert (ship / "datasets" / "0" / "train.jsonl").read_bytes() == TINY_DATA.read_bytes()
    assert load_records(shipped.datasets, base_dir=ship) == load_records(loaded.spec.train.datasets)

    # A data file outside the job's directory, or a missing one, is refused with the key and its line.
    job.write_text(job.read_text().replace("data/train.jsonl", "../elsewhere.jsonl"))
    with pytest.raises(ConfigError) as err:
        load_job(job)
    assert "datasets[0].data_files" in str(err.value) and "line 5" in str(err.value)
    job.write_text(job.read_text().replace("../elsewhere.jsonl", "data/missing.jsonl"))
    with pytest.raises(ConfigError) as err:
        load_job(job)
    assert "datasets[0].data_files" in str(err.value) and "file not found" in str(err.value)
