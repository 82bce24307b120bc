"""A pool node's failsafe (providers.onnode.poolstop): shipped to pool nodes only, after the failsafe's own
code in one namespace, so the rented nodes' start script is as it was; and what it does when it fires:
every process of the node's session ends, one that ignores SIGTERM by SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from jobs.sections import ProviderName
from providers import bootstrap
from providers.bootstrap import failsafe_argv, start_script
from providers.onnode import poolstop

REPO = Path(__file__).resolve().parents[2]


def test_a_pool_nodes_failsafe_knows_its_vendor_and_the_rented_nodes_carry_none_of_it(tmp_path: Path) -> None:
    python3, dash_c, loader, vendor = failsafe_argv(bootstrap.POOL)
    env = {"PATH": os.environ["PATH"], "FLEET_DEADLINE_S": "soon"}
    done = subprocess.run(  # away from the repository: the node has none of the fleet's packages
        [python3, dash_c, loader, vendor], env=env, cwd=tmp_path, capture_output=True, text=True, check=False
    )
    # It got as far as reading its settings: "ssh" is a vendor it knows (else: "off: unknown vendor").
    assert (done.returncode, done.stderr) == (
        2,
        "trainfleet failsafe: off: could not convert string to float: 'soon'\n",
    )
    packed = bootstrap.packed(poolstop)
    assert packed in loader and packed not in start_script(ProviderName("vastai"))
    assert packed not in start_script(ProviderName("runpod"))


def _in_session(session: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(entry)) == session:
                found.append(int(entry))
        except OSError:
            continue
    return found


def test_when_it_fires_every_process_of_the_node_ends(tmp_path: Path) -> None:
    program = (
        "import subprocess, time\n"
        "from providers.onnode import poolstop\n"
        "subprocess.Popen(['sleep', '60'])\n"
        "subprocess.Popen(['sh', '-c', 'trap \"\" TERM; sleep 60; sleep 60'])  # deaf to SIGTERM\n"
        "time.sleep(0.5)\n"
        "poolstop.STOP_GRACE_S = 1.0\n"
        "poolstop.stop_pool_node({})()\n"
        "print('stopped')\n"
    )
    node = subprocess.Popen(
        [sys.executable, "-c", program], cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    out, _ = node.communicate(timeout=60)
    assert out.strip() == "stopped" and node.returncode == 0
    deadline = time.monotonic() + 5
    while (left := _in_session(node.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], "processes of the node's session outlived its failsafe"
