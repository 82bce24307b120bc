"""The node's software setup (providers.onnode.nodesetup), shipped and run as a node's start script runs it:
with an image's python3, installing only what that python lacks of the pins, from a local wheel (no index
here)."""

from __future__ import annotations

import ast
import base64
import json
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from importlib import metadata
from pathlib import Path

import pytest

from providers.bootstrap import SETUP_ENV, SETUP_LOADER, packed
from providers.onnode import nodesetup

BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


def test_what_is_missing_is_what_is_absent_or_at_another_version_but_torch_any_build() -> None:
    pip = metadata.version("pip")
    assert nodesetup.missing([f"pip=={pip}", "torch==0.0.1", "tfprobe==1.0", "pip==0.1"]) == [
        "tfprobe==1.0",
        "pip==0.1",
    ]
    with pytest.raises(ValueError, match="not a pin"):
        nodesetup.missing(["peft>=0.1"])


def _wheel(folder: Path) -> Path:
    """A real wheel of a one-module package, tfprobe 1.0."""
    folder.mkdir()
    path = folder / "tfprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("tfprobe/__init__.py", "VERSION = '1.0'\n")
        whl.writestr("tfprobe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tfprobe\nVersion: 1.0\n")
        whl.writestr(
            "tfprobe-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        whl.writestr("tfprobe-1.0.dist-info/RECORD", "")
    return folder


@pytest.mark.skipif(not BASE_PYTHON.exists(), reason="no base interpreter beside this venv")
def test_an_image_lacking_a_pin_gets_it_in_a_venv_that_still_sees_the_images_packages(tmp_path: Path) -> None:
    wheels = _wheel(tmp_path / "wheels")
    # The image's python has pip: that pin holds, so nothing reinstalls it.
    pip = subprocess.run(
        [str(BASE_PYTHON), "-c", "from importlib import metadata; print(metadata.version('pip'))"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        SETUP_ENV: packed(nodesetup),
        nodesetup.PINS_ENV: f"pip=={pip} tfprobe==1.0",
        nodesetup.PYTHON_ENV: f"{sys.version_info[0]}.{sys.version_info[1]}",
        nodesetup.VENV_ENV: str(tmp_path / "venv"),
        nodesetup.PIP_ARGS_ENV: f"--no-index --find-links {wheels}",
        "FLEET_NODE_ROOT": str(tmp_path / "volume" / "trainfleet"),
    }
    loader = SETUP_LOADER
    done = subprocess.run(
        [str(BASE_PYTHON), "-c", loader], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    exports = subprocess.run(
        ["sh", "-c", f'{done.stdout}\necho "$FLEET_NODE_ROOT"; echo "$PATH"'],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert exports == [env["FLEET_NODE_ROOT"], f"{tmp_path / 'venv' / 'bin'}:/usr/bin:/bin"]
    result = json.loads((tmp_path / "volume" / "trainfleet" / "node-setup.json").read_text())
    assert result["installed"] == ["tfprobe==1.0"] and "error" not in result
    assert result["python"] == str(tmp_path / "venv" / "bin" / "python") and result["seconds"] >= 0
    probe = "import tfprobe, pip; print(tfprobe.VERSION)"
    ran = subprocess.run([result["python"], "-c", probe], capture_output=True, text=True, timeout=60)
    assert ran.stdout.strip() == "1.0", ran.stderr
    # A second node of the same home finds the venv made: it is not made again under the first one's
    # processes (a new pyvenv.cfg, written while they start, hides the image's packages from them).
    made = (tmp_path / "venv" / "pyvenv.cfg").stat()
    again = subprocess.run(
        [str(BASE_PYTHON), "-c", loader], env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "venv" / "pyvenv.cfg").stat().st_mtime_ns == made.st_mtime_ns
    log = (tmp_path / "volume" / "trainfleet" / nodesetup.LOG).read_text()
    assert log.count("-m venv") == 1, log
    # The program that ran is the module, less its docstrings (it travels in the pod's environment), and
    # an image's older python3 can read it (the ones Ray 2.60 supports, from 3.9).
    source = zlib.decompress(base64.b64decode(packed(nodesetup))).decode()
    assert '"""' not in source
    ast.parse(source, feature_version=(3, 9))


@pytest.mark.skipif(not BASE_PYTHON.exists(), reason="no base interpreter beside this venv")
def test_a_failed_install_is_recorded_and_ray_still_starts_from_the_images_python(tmp_path: Path) -> None:
    env = {
        nodesetup.PINS_ENV: "tfprobe==9.9",
        nodesetup.VENV_ENV: str(tmp_path / "venv"),
        nodesetup.PIP_ARGS_ENV: f"--no-index --find-links {tmp_path}",
        "FLEET_NODE_ROOT": str(tmp_path / "root"),
    }
    assert nodesetup.node_root(env) == str(tmp_path / "root")
    bin_dir = str(BASE_PYTHON.parent)  # not this venv: it must not be installed into
    program = "import os; from providers.onnode import nodesetup; nodesetup.main(dict(os.environ))"
    done = subprocess.run(
        [str(BASE_PYTHON), "-c", program], env=env, capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert f"export PATH={bin_dir}:" in done.stdout
    result = json.loads((tmp_path / "root" / "node-setup.json").read_text())
    assert result["installed"] == [] and result["error"].startswith("CalledProcessError")


def test_installs_into_one_venv_take_turns(tmp_path: Path) -> None:
    # Two nodes of one home (pool machines sharing it, or two runs on one) install into one venv: one at a
    # time, so that no pip reads a half-written site-packages.
    order: list[str] = []

    def install(who: str) -> None:
        with nodesetup._exclusive(str(tmp_path / "venv.lock")):
            order.append(f"{who} in")
            time.sleep(0.3)
            order.append(f"{who} out")

    threads = [threading.Thread(target=install, args=(w,)) for w in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])
