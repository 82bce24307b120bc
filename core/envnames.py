"""The environment variable names a job's `env` may not set, each group with the reason, in one place.

A job's `env` (jobs.sections) goes into its node's environment. It must not change what code the node's
processes load (loader and interpreter variables), nor any name that the fleet, Ray, the vendor or what
the fleet starts on a node reads: the node's failsafe (providers.onnode.failsafe), its start script
(providers.bootstrap) and its setup (providers.onnode.nodesetup). A job that set FLEET_RAY_HEAD_ADDRESS, or
the instance id a cloud sets, could switch the failsafe off, and one that set LD_PRELOAD or PYTHONPATH ran
its own code in every Ray process. Validation refuses these names (`refusal`), and the providers drop them
from a job's `env` whatever its origin (`job_may_set`), so a job in the ledger from before is held too.

The names a cloud sets in its nodes' environment (its instance id and own key) are the cloud's, declared in
its package (providers/<cloud>/facts.py: `set_by_the_cloud`) and handed here by the registry
(`declare_clouds`); until it has, `refusal` raises rather than let such a name through.

The failsafe runs on the node from the standard library alone and cannot import this module: the names it
reads are repeated in NODE_READS and the clouds' groups, and a test holds them in step
(tests/security/test_environments.py).
"""

from __future__ import annotations

from dataclasses import dataclass

FLEET_PREFIX = "FLEET_"
FAULT_INJECTION = "FLEET_INJECT"  # trainer.faults' variable: set by the fleet for a drill, never by a job

SSH_PUBLIC_KEY = "PUBLIC_KEY"  # the fleet's SSH key in a node's environment (the start script reads it)
JUPYTER_TOKEN = "JUPYTER_TOKEN"  # JupyterLab's token, which the start script sets from the fleet's
NODE_READS = (
    "RAY_TMPDIR",  # where the failsafe finds Ray's dashboard log (its heartbeats)
    "TMPDIR",  # ... when neither FLEET_RAY_TEMP_DIR nor RAY_TMPDIR is set
    SSH_PUBLIC_KEY,
    JUPYTER_TOKEN,
)
"""The names other than FLEET_* and the clouds' that what the fleet starts on a node reads from its
environment."""


@dataclass(frozen=True)
class Reserved:
    """A group of names a job may not set: exact names and prefixes, and why."""

    names: frozenset[str]
    prefixes: tuple[str, ...]
    reason: str

    def covers(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


LOADER = Reserved(
    frozenset(
        {
            "PATH",
            "HOME",  # Python's user site (~/.local) is found from it
            "BASH_ENV",
            "ENV",
            "IFS",
            "CDPATH",
            "SHELLOPTS",
            "BASHOPTS",
            "PS4",
            "GCONV_PATH",
            "LOCPATH",
            "NLSPATH",
            "PERL5LIB",
            "PERL5OPT",
            "PERLLIB",
            "RUBYLIB",
            "RUBYOPT",
            "NODE_OPTIONS",
            "NODE_PATH",
            "VIRTUAL_ENV",
            "CONDA_PREFIX",
            "OPENSSL_CONF",  # OpenSSL reads it in every process that loads it (the failsafe's Python too),
            "OPENSSL_MODULES",  # and it, OPENSSL_MODULES and OPENSSL_ENGINES load shared libraries
            "OPENSSL_ENGINES",
        }
    ),
    ("LD_", "DYLD_", "PYTHON"),
    "loader and interpreter variables (LD_*, DYLD_*, PYTHON*, PATH, HOME, BASH_ENV, ENV...) decide what "
    "code the node's processes load, and a job cannot set them",
)
FLEET = Reserved(
    frozenset(),
    (FLEET_PREFIX,),
    f"names starting {FLEET_PREFIX} are the fleet's own (the node's root, its failsafe, its token...) and "
    "a job cannot set them",
)
RAY = Reserved(
    frozenset(),
    ("RAY_",),
    "names starting RAY_ configure Ray itself (its address, token, temp dir) and a job cannot set them",
)
NODE = Reserved(
    frozenset(NODE_READS),
    (),
    "the fleet sets this name on its nodes (the fleet's SSH key, JupyterLab's token, where Ray keeps its "
    "logs) and a job cannot set it",
)
DRILL = Reserved(
    frozenset({FAULT_INJECTION}),
    (),
    "the trainer's fault injection is for the fleet's drills and a job cannot set it (a fleet's operator "
    "sets fault_injection in its settings for one)",
)
ENDPOINTS = Reserved(
    frozenset({"HF_ENDPOINT", "WANDB_BASE_URL"}),
    (),
    "where the node sends the fleet's HF_TOKEN and WANDB_API_KEY is the fleet's setting (hf_endpoint, "
    "wandb_base_url), passed to its nodes, and a job cannot set it",
)
RESERVED = (DRILL, LOADER, FLEET, RAY, NODE, ENDPOINTS)
"""The fleet's own groups; the clouds' are declared (`declare_clouds`)."""


def set_by_the_cloud(names: tuple[str, ...], prefixes: tuple[str, ...]) -> Reserved:
    """A cloud's group: the names it sets in its nodes' environment, and its prefixes."""
    return Reserved(
        frozenset(names),
        prefixes,
        "the cloud sets this name on its nodes (the instance's id and own key, which the node's failsafe "
        "uses to give it back) and a job cannot set it",
    )


_CLOUDS: tuple[Reserved, ...] | None = None


def declare_clouds(groups: tuple[Reserved, ...]) -> None:
    """The registered clouds' groups (providers.registry, once per process)."""
    global _CLOUDS
    _CLOUDS = groups


def clouds() -> tuple[Reserved, ...]:
    """The registered clouds' groups; RuntimeError before the registry declared them."""
    if _CLOUDS is None:
        raise RuntimeError("no cloud's reserved names are declared yet: import providers.registry first")
    return _CLOUDS


def refusal(name: str) -> str | None:
    """Why a job may not set the variable `name`; None when it may."""
    return next((group.reason for group in (*RESERVED, *clouds()) if group.covers(name)), None)


def job_may_set(name: str) -> bool:
    """Whether a job's `env` may set the variable `name`."""
    return refusal(name) is None
