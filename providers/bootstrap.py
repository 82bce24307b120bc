"""What a rented node runs when it starts: its failsafe, the node's software set up
(providers.onnode.nodesetup: what the image lacks of the fleet's pins, installed), then a Ray head with token
auth and its Jobs API on port 8265 (or, for a cluster's node k > 0, a Ray node that joins the head). Runs keep
their files under FLEET_NODE_ROOT. Built from argv lists and quoted with shlex; nothing of the job's is in it,
and the token is read from the environment, never inlined.
"""

from __future__ import annotations

import ast
import base64
import functools
import inspect
import json
import re
import shlex
import sys
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

import trainer
from core import envnames
from jobs.sections import ProviderName
from providers.base import JUPYTER_PORT, JUPYTER_TOKEN_ENV, SSH_KEY_ENV, NodeSoftware
from providers.onnode import failsafe, nodesetup, poolstop, tlsfront
from trainer import stopnotice
from trainer.progress import NODE_ROOT_ENV

POOL = ProviderName("ssh")  # the operator's machines: a node's failsafe ends it (onnode.poolstop)
JOBS_PORT = 8265  # the Ray dashboard / Jobs API inside the node, published by the provider
INNER_JOBS_PORT = 8266  # behind the node's TLS front (onnode.tlsfront) the dashboard listens on loopback only
TLS_CERT_ENV, TLS_KEY_ENV = tlsfront.CERT_ENV, tlsfront.KEY_ENV  # the node's certificate and key (PEM)
TOKEN_ENV = "FLEET_RAY_TOKEN"  # the node's Ray token arrives in this environment variable
SETUP_ENV = "FLEET_NODE_SETUP"  # providers.onnode.nodesetup, packed
# A pod started from a RunPod template runs the template's start command, which runs our start script from
# this variable (`sh -c "$FLEET_BOOTSTRAP"`): see the README's "What runs on the node".
BOOTSTRAP_ENV = "FLEET_BOOTSTRAP"
# What runs the node setup program from the environment: `python3 -c SETUP_LOADER`.
SETUP_LOADER = f'import base64,os,zlib;exec(zlib.decompress(base64.b64decode(os.environ["{SETUP_ENV}"])))'
ACCESS_ENV = "FLEET_NODE_ACCESS"  # the access lines below, which the start script `eval`s before Ray
INNER_JUPYTER_PORT = 8889  # behind a TLS front JupyterLab listens here, on loopback only


def access_lines(tls: bool = False) -> tuple[str, ...]:
    """A way into a kept node, each in the background so that neither a slow install nor a failure touches
    Ray: sshd with the fleet's key in root's authorized_keys (our start command replaces the image's, so
    nothing else starts sshd; `sudo -n` on an image that runs as another user), and JupyterLab with the
    node's own token, passed in its environment (not on its command line), its log (which shows the URL)
    owner-only, and the token unset before Ray so that no Ray job inherits it. With `tls` (a node reached
    by its public address) JupyterLab listens on loopback, behind the node's TLS front on its published
    port; it then takes requests for the host's address (`allow_remote_access`: on loopback it would refuse
    a Host header that is not a local name), which its token still guards."""
    if tls:
        listen = f"--ip=127.0.0.1 --port={INNER_JUPYTER_PORT} --ServerApp.allow_remote_access=True"
    else:
        listen = f"--ip=0.0.0.0 --port={JUPYTER_PORT}"
    return (
        f'if [ -n "${{{SSH_KEY_ENV}:-}}" ]; then (',
        '  S=""; [ "$(id -u)" = 0 ] || S="sudo -n"',
        "  $S mkdir -p /root/.ssh && $S chmod 700 /root/.ssh",
        f'  $S grep -qxF "${SSH_KEY_ENV}" /root/.ssh/authorized_keys'
        f" || printf '%s\\n' \"${SSH_KEY_ENV}\" | $S tee -a /root/.ssh/authorized_keys",
        "  $S chmod 600 /root/.ssh/authorized_keys",
        "  [ -x /usr/sbin/sshd ] || { $S apt-get update -qq"
        " && $S env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server; }",
        "  $S mkdir -p /run/sshd && $S ssh-keygen -A && $S /usr/sbin/sshd",
        ") >/dev/null 2>&1 & fi",
        f'if [ -n "${{{JUPYTER_TOKEN_ENV}:-}}" ]; then (',
        f'  umask 077 && exec >"${NODE_ROOT_ENV}/jupyter.log" 2>&1',
        '  python3 -c "import jupyterlab" || python3 -m pip install -q jupyterlab',
        f'  {envnames.JUPYTER_TOKEN}="${JUPYTER_TOKEN_ENV}" exec python3 -m jupyterlab {listen}'
        " --no-browser --allow-root",
        ") & fi",
        f"unset {JUPYTER_TOKEN_ENV}",
    )


ACCESS_LINES = access_lines()  # a node reached through its vendor's HTTPS proxy (RunPod's)
NODE_REQUIREMENTS = Path(trainer.__file__).with_name("requirements-node.txt")
NODE_PINS = Path(trainer.__file__).with_name("node-pins.txt")
HEAD_ADDRESS_ENV = failsafe.HEAD_ENV  # a worker node joins the Ray head at this host:port
GCS_PORT = 6379  # the head's Ray GCS (Ray's default), where worker nodes join
JOIN_RETRY_S = 5
# After SIGTERM, how long the start script keeps Ray for the trainer to keep its checkpoint (it ends Ray as
# soon as the trainer says it did); a vendor's own grace (RunPod's: 5 s) usually ends the machine first.
STOP_GRACE_S = 60
# The stop notice's file: the container's own, not under FLEET_NODE_ROOT (a volume other pods may mount).
NODE_NOTICE = "/tmp/trainfleet-stop-notice"


def head_argv(tls: bool = False) -> list[str]:
    """`ray start` for the node's head (it blocks, so the container lives as long as the head). With `tls`
    its dashboard listens on loopback only, behind the node's TLS front on the published port."""
    host, port = ("127.0.0.1", INNER_JOBS_PORT) if tls else ("0.0.0.0", JOBS_PORT)
    return [
        "ray",
        "start",
        "--head",
        "--block",
        f"--dashboard-host={host}",
        f"--dashboard-port={port}",
        "--disable-usage-stats",
    ]


def tlsfront_argv() -> list[str]:
    """The node's TLS front (`python3 -c`, standard library only): the published Jobs API port, over TLS
    with the node's certificate, to the dashboard on loopback (the start script adds JupyterLab's ports on a
    node that runs it)."""
    loader = f'import base64,zlib;exec(zlib.decompress(base64.b64decode("{packed(tlsfront)}")))'
    return ["python3", "-c", loader, str(JOBS_PORT), str(INNER_JOBS_PORT)]


@functools.cache
def packed(module: ModuleType) -> str:
    """A stdlib-only module of ours without its docstrings, comments and the annotations of its functions
    (`from __future__ import annotations` makes them strings nothing reads), compressed and in base64: what
    runs on the node before anything of ours is there travels in the vendor's create call (the start
    script in vast.ai's `onstart` or RunPod's `dockerArgs`, the rest in the environment)."""
    tree = ast.parse(inspect.getsource(module))
    # The node has none of our packages: an import of ours (poolstop's, of the failsafe it runs after) goes.
    tree.body = [s for s in tree.body if not (isinstance(s, ast.ImportFrom) and _ours(s.module))]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    tree = ast.fix_missing_locations(_Unannotated().visit(tree))
    return base64.b64encode(zlib.compress(ast.unparse(tree).encode(), 9)).decode()


def _ours(module: str | None) -> bool:
    return (module or "").split(".")[0] in ("providers", "core", "jobs", "trainer")


class _Unannotated(ast.NodeTransformer):
    """Drops the annotations of functions and of what they assign; a class body's are kept (a dataclass
    reads them)."""

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        node.returns = None
        arguments = node.args
        for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            argument.annotation = None
        for extra in (arguments.vararg, arguments.kwarg):
            if extra is not None:
                extra.annotation = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return node
        return ast.copy_location(ast.Assign([node.target], node.value), node)

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        for statement in node.body:
            if not isinstance(statement, ast.AnnAssign):
                self.visit(statement)
        return node


def packed_failsafe() -> str:
    """providers.onnode.failsafe, packed: it travels in the start script itself, so it is kept to a few KB."""
    return packed(failsafe)


@functools.cache
def node_pins() -> tuple[str, ...]:
    """The node's software at exact versions (trainer/node-pins.txt, one `name==version` per requirement of
    trainer/requirements-node.txt): a node installs exactly these of what its image lacks, and `make setup`
    builds the fleet's and the local nodes' environments at them, so no node drifts from the fleet."""
    return tuple(pin for line in NODE_PINS.read_text(encoding="utf-8").splitlines() if (pin := _bare(line)))


def node_requirements() -> list[str]:
    """trainer/requirements-node.txt's requirements, as written (`ray[default,train]==2.60.*`)."""
    return [
        req for line in NODE_REQUIREMENTS.read_text(encoding="utf-8").splitlines() if (req := _bare(line))
    ]


def requirement_name(requirement: str) -> str:
    """`ray[default,train]==2.60.*` -> `ray[default,train]`: the name with its extras."""
    return re.split(r"[<>=!~;\s]", requirement, maxsplit=1)[0]


def canonical(name: str) -> str:
    """PEP 503's normal form, extras dropped: `PyYAML` is `pyyaml`, `huggingface_hub` `huggingface-hub`."""
    return re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()


def pins_from_report(report: dict[str, Any]) -> list[str]:
    """Each node requirement at the version pip resolved for it: `report` is what `pip install --dry-run
    --ignore-installed --report FILE -r trainer/requirements-node.txt` wrote (`make node-pins`)."""
    resolved = {
        canonical(item["metadata"]["name"]): item["metadata"]["version"].split("+")[0]  # 2.13.0+cpu: 2.13.0
        for item in report["install"]
    }
    names = [requirement_name(req) for req in node_requirements()]
    return [f"{name}=={resolved[canonical(name)]}" for name in names]


def _bare(line: str) -> str:
    return line.split("#", 1)[0].strip()


def axolotl_pins(version: str | None, source: str | None = None) -> tuple[str, ...]:
    """An axolotl node's software: axolotl at `version`, or from the fork `source` (`git+URL[@ref]`, a
    PEP 508 direct reference), and the fleet's Ray. Nothing else is pinned: axolotl pins its own torch,
    transformers and peft, and the image's build of them is what it was tested with."""
    ray = next(pin for pin in node_pins() if pin.startswith("ray"))
    return (f"axolotl@{source}" if source else f"axolotl=={version}", ray)


def node_setup_env(software: NodeSoftware | None = None, tls: bool = False) -> dict[str, str]:
    """What a rented node's start script needs in its environment to set the node's software up
    (providers.onnode.nodesetup: the program, the pins, the fleet's Python version) and to let its owner in
    (`access_lines`; `tls`: JupyterLab behind the node's TLS front). An axolotl node keeps its image's
    Python (axolotl's images are built for theirs)."""
    env = {ACCESS_ENV: "\n".join(access_lines(tls)), SETUP_ENV: packed(nodesetup)}
    axolotl = software is not None and software.trainer == "axolotl"
    if axolotl and software is not None and (software.axolotl_version or software.axolotl_source):
        pins = axolotl_pins(software.axolotl_version, software.axolotl_source)
        return {**env, nodesetup.PINS_ENV: " ".join(pins)}
    return {
        **env,
        nodesetup.PINS_ENV: " ".join(node_pins()),
        nodesetup.PYTHON_ENV: f"{sys.version_info[0]}.{sys.version_info[1]}",
    }


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def failsafe_argv(vendor: ProviderName) -> list[str]:
    """The node's failsafe for a node of `vendor`, as argv (`python3 -c`, standard library only). A pool
    node's (ssh) runs providers.onnode.poolstop after the failsafe's code, in one namespace."""
    if vendor == POOL:
        run = "exec(zlib.decompress(base64.b64decode({!r})),g)"
        code = ";".join(run.format(p) for p in (packed_failsafe(), packed(poolstop)))
        return ["python3", "-c", f'import base64,zlib;g={{"__name__":"failsafe"}};{code}', vendor.value]
    loader = f'import base64,zlib;exec(zlib.decompress(base64.b64decode("{packed_failsafe()}")))'
    return ["python3", "-c", loader, vendor.value]


def failsafe_env(deadline_s: int | None, heartbeat_timeout_s: float | None) -> dict[str, str]:
    """What arms the failsafe in the node's environment: its maximum lifetime and how long it waits for
    the fleet's heartbeat (neither: it exits at once)."""
    env = {}
    if deadline_s is not None:
        env[failsafe.DEADLINE_ENV] = str(deadline_s)
    if heartbeat_timeout_s is not None:
        env[failsafe.HEARTBEAT_ENV] = f"{heartbeat_timeout_s:g}"
    return env


def worker_argv() -> list[str]:
    """`ray start` for a node that joins the head at $FLEET_RAY_HEAD_ADDRESS (appended by the script)."""
    return ["ray", "start", "--block", "--disable-usage-stats"]


def start_script(
    vendor: ProviderName | None = None,
    worker: bool = False,
    private_host: str | None = None,
    tls: bool = False,
    ray: list[str] | None = None,
) -> str:
    """A POSIX shell script: the failsafe of a `vendor` node in the background (first, so that a node
    whose start goes wrong later goes too), token auth on, the node's software set up and its root chosen
    (providers.onnode.nodesetup, carried by FLEET_NODE_SETUP: what the image lacks is installed, Ray starts
    from that venv, and runs keep their files under FLEET_NODE_ROOT, on the volume when the provider set one),
    SSH and JupyterLab when asked for (`access_lines`, carried by FLEET_NODE_ACCESS), then Ray in the
    foreground: the head, or for a `worker` node a `ray start --address` that joins the head at
    $FLEET_RAY_HEAD_ADDRESS, tried again every few seconds while the head is not up yet (or restarts).
    `private_host` (a constant of the provider's, such as `$RUNPOD_POD_ID.runpod.internal`) is this
    node's name on the private network: Ray then advertises that address, which the cluster's other nodes
    can reach, instead of the one it would guess. The job's `entry` is not here: it runs as prepare's
    first Ray job (workers.entry), checked and logged. With `tls` (a node reached by its public address)
    the head's Jobs API, and JupyterLab on a node that runs it, are published only through the node's TLS
    front (providers.onnode.tlsfront), whose certificate and key the script then takes out of the environment,
    before anything else starts. `ray`: the node's `ray start` argv instead of `head_argv`'s or
    `worker_argv`'s (a pool machine's: ports and a temp dir of its own)."""
    lines = ["set -eu"]
    if vendor is not None:
        lines.append(shlex.join(failsafe_argv(vendor)) + " &")
    if tls:  # first, so that nothing started later (setup, SSH, JupyterLab, Ray) inherits the key
        jupyter = f"${{{JUPYTER_TOKEN_ENV}:+{JUPYTER_PORT} {INNER_JUPYTER_PORT}}}"  # two words, or none
        lines += [
            f'[ -z "${{{TLS_CERT_ENV}:-}}" ] || {shlex.join(tlsfront_argv())} {jupyter} &',
            f"unset {TLS_CERT_ENV} {TLS_KEY_ENV}",
        ]
    lines += [
        f'export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${TOKEN_ENV}"',
        f'eval "$(python3 -c {shlex.quote(SETUP_LOADER)} || true)"',  # exports FLEET_NODE_ROOT and PATH
        f'export {NODE_ROOT_ENV}="${{{NODE_ROOT_ENV}:-/tmp/trainfleet}}"',
        f'[ -z "${{{ACCESS_ENV}:-}}" ] || eval "${ACCESS_ENV}"',  # SSH, JupyterLab (access_lines)
    ]
    node_ip = ""
    if private_host:
        lines.append(f'NODE_IP="$(getent hosts "{private_host}" | awk \'{{print $1; exit}}\')" || NODE_IP=""')
        node_ip = ' ${NODE_IP:+"--node-ip-address=$NODE_IP"}'
    lines += stop_notice_lines()
    if worker:
        join = shlex.join(ray or worker_argv()) + f' --address="${HEAD_ADDRESS_ENV}"' + node_ip
        again = f'[ -n "$STOPPING" ] || sleep {JOIN_RETRY_S}'
        lines.append(f'while [ -z "$STOPPING" ]; do fleet_ray {join} || true; {again}; done')
    else:
        lines.append("fleet_ray " + shlex.join(ray or head_argv(tls)) + node_ip)
    return "\n".join(lines)


def stop_notice_lines() -> list[str]:
    """Ray in the background under a shell that outlives it, so that SIGTERM (a container's stop: what a
    vendor sends before it takes a machine back) reaches a trap rather than Ray: the trap writes the node's
    stop notice ($FLEET_STOP_NOTICE, NODE_NOTICE unless set: trainer.stopnotice), which the trainer sees at
    its next step, and leaves Ray running until the trainer says its checkpoint is kept (the notice's
    `.saved`) or STOP_GRACE_S pass, then ends it, so the container ends. `fleet_ray ARGV` runs Ray so and
    returns its exit status; `STOPPING` is set once told."""
    notice = stopnotice.NOTICE_ENV
    saved = f'S="${notice}{stopnotice.SAVED_SUFFIX}"; rm -f "$S"'
    told = f'echo SIGTERM >"${notice}" || true'
    waiting = f'[ $i -lt {STOP_GRACE_S} ] && kill -0 $RAY && [ ! -e "$S" ]'
    waits = f"i=0; while {waiting}; do sleep 1; i=$((i+1)); done"
    return [
        f'export {notice}="${{{notice}:-{NODE_NOTICE}}}"; RAY=; STOPPING=',
        f"fleet_stop() {{ STOPPING=1; {saved}; {told}; ({waits}; kill $RAY) 2>/dev/null & }}",
        "trap fleet_stop TERM",
        'fleet_ray() { "$@" & RAY=$!; rc=0; while kill -0 $RAY 2>/dev/null;'
        " do wait $RAY && rc=0 || rc=$?; done; return $rc; }",
    ]


def container_command(
    vendor: ProviderName | None = None,
    worker: bool = False,
    private_host: str | None = None,
) -> list[str]:
    """The container's command as argv (`sh -c SCRIPT`)."""
    return ["sh", "-c", start_script(vendor, worker, private_host)]


def write_pins(report: Path) -> None:
    """Rewrites trainer/node-pins.txt from pip's report, keeping its comments (`make node-pins`)."""
    comments = [line for line in NODE_PINS.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    pins = pins_from_report(json.loads(report.read_text(encoding="utf-8")))
    NODE_PINS.write_text("\n".join([*comments, *pins]) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_pins(Path(sys.argv[1]))
