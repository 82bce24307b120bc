"""providers.local.environment.software_key: the fingerprint under which a local node's passed readiness
check is remembered (workers.readiness) changes with anything that could change the check's answer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from providers.base import ProviderContext
from providers.local import environment
from providers.local.client import HeadMeta
from providers.local.environment import software_key
from providers.local.provider import LocalProvider

ENV = {"HOME": "/root", "CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "hf_first"}


def venv(root: Path) -> Path:
    """A virtual environment's layout: bin/python, pyvenv.cfg and a site-packages with one package."""
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.symlink_to(sys.executable)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "peft-0.21.2.dist-info").mkdir(parents=True)
    (site / "peft").mkdir()
    return python


def test_the_same_software_has_the_same_key(tmp_path: Path) -> None:
    python = venv(tmp_path / "v")
    first = software_key(python, ENV, 0)
    assert len(first) == 64 and software_key(python, dict(ENV), 0) == first


def test_an_install_an_upgrade_or_a_removal_changes_it(tmp_path: Path) -> None:
    python = venv(tmp_path / "v")
    site = tmp_path / "v" / "lib" / "python3.11" / "site-packages"
    seen = {software_key(python, ENV, 0)}
    (site / "wandb-0.31.0.dist-info").mkdir()  # installed
    seen.add(software_key(python, ENV, 0))
    (site / "peft-0.21.2.dist-info").rename(site / "peft-0.22.0.dist-info")  # upgraded
    seen.add(software_key(python, ENV, 0))
    (site / "wandb-0.31.0.dist-info").rmdir()  # removed
    seen.add(software_key(python, ENV, 0))
    assert len(seen) == 4


def test_gpus_environment_and_interpreter_change_it_but_not_a_credentials_value(tmp_path: Path) -> None:
    python = venv(tmp_path / "v")
    base = software_key(python, ENV, 0)
    assert software_key(python, ENV, 1) != base
    assert software_key(python, {**ENV, "CUDA_VISIBLE_DEVICES": "1"}, 0) != base
    assert software_key(python, {**ENV, "TRANSFORMERS_OFFLINE": "1"}, 0) != base
    assert software_key(venv(tmp_path / "other"), ENV, 0) != base
    # A credential counts by its name only: its value cannot change what imports, and is never hashed.
    assert software_key(python, {**ENV, "HF_TOKEN": "hf_second"}, 0) == base
    assert software_key(python, {k: v for k, v in ENV.items() if k != "HF_TOKEN"}, 0) != base


def test_an_interpreter_outside_a_virtual_environment_has_none(tmp_path: Path) -> None:
    python = venv(tmp_path / "v")
    (tmp_path / "v" / "pyvenv.cfg").unlink()  # a system Python: its packages are where this does not look
    assert software_key(python, ENV, 0) == ""
    assert software_key(tmp_path / "nowhere" / "bin" / "python", ENV, 0) == ""


def test_the_local_provider_tells_a_heads_key_and_a_cloud_provider_none(tmp_path: Path) -> None:
    provider = LocalProvider(ProviderContext(home=tmp_path))
    (tmp_path / "nodes" / "tf-a-1").mkdir(parents=True)
    ports = {"dashboard_port": 1}
    provider.heads._write(HeadMeta("tf-a-1", "/tmp/x", ports, (2, 3), 1, 0, 0.0, software="k1"))
    (tmp_path / "nodes" / "tf-b-1").mkdir(parents=True)
    provider.heads._write(HeadMeta("tf-b-1", "/tmp/y", ports, (2, 3), 1, 0, 0.0))  # written before keys
    assert provider.software_key("tf-a-1") == "k1"
    assert provider.software_key("tf-b-1") is None and provider.software_key("tf-none-1") is None


def test_a_gpu_driver_update_changes_the_key_of_a_node_with_gpus_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = venv(tmp_path / "v")
    driver = tmp_path / "version"
    monkeypatch.setattr(environment, "GPU_DRIVER", driver)
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
    cpu, gpu = software_key(python, ENV, 0), software_key(python, ENV, 1)
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.10\n")
    assert software_key(python, ENV, 0) == cpu and software_key(python, ENV, 1) != gpu
