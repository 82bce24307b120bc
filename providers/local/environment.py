"""A local Ray node's environment, built from an allowlist rather than inherited from the fleet's.

The fleet's own environment holds the cloud keys, its settings (FLEET_*) and its interpreter's (VIRTUAL_ENV,
PYTHONPATH...); a local node's processes run a job's code, so they get none of that: only what lets them
work on this machine (`kept_env`), the node's own `env` (the job's, validated, and its credentials by
name), and the head's settings last.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

# What a local node keeps of the fleet's environment: who and where it runs (user, home, locale, time zone,
# temporary files), the GPUs it may use, the Hugging Face caches and endpoint, the way out (proxies, CA
# bundles) and the W&B server. Nothing else: not the cloud keys, nor FLEET_*, RAY_*, LD_* or PYTHON*.
NODE_ENV_KEPT = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "CUDA_VISIBLE_DEVICES",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
    }
)
NODE_ENV_KEPT_PREFIXES = ("LC_", "HF_", "TRANSFORMERS_")
_CREDENTIAL_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY")  # HF_TOKEN, HF_TOKEN_PATH... stay out
GPU_DRIVER = Path("/proc/driver/nvidia/version")  # the NVIDIA driver's version, where one is loaded
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

# Ray turns `--node-ip-address=127.0.0.1` into this machine's address, and then its GCS, raylet, agents and
# metrics listen on every interface, unless it runs as a single-machine Ray (cluster mode off, as on Windows
# and macOS): then each of them listens on 127.0.0.1. Ray refuses to join a cluster in that mode, so a node
# that joins a head (the fakes' clusters) keeps Ray's default and listens on every interface.
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def kept_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a local node keeps of `environ` (the fleet's environment): NODE_ENV_KEPT, the LC_*, HF_* and
    TRANSFORMERS_* settings, never a name that looks like a credential (the node's credentials are
    given to it by name, in its `env`)."""
    return {
        name: value
        for name, value in environ.items()
        if (name in NODE_ENV_KEPT or name.startswith(NODE_ENV_KEPT_PREFIXES))
        and not any(word in name.upper() for word in _CREDENTIAL_WORDS)
    }


def head_env(environ: Mapping[str, str], env: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """A local node's environment, built rather than inherited: what it keeps of the fleet's `environ`,
    then `env` (the node's: the job's validated `env`, its credentials, the values a fake cloud gives its
    nodes), then `own`, the head's settings, last so that nothing before overrides them."""
    return {**kept_env(environ), **env, **own}


def software_key(python: Path, env: Mapping[str, str], num_gpus: int) -> str:
    """A fingerprint of what a local node trains with (providers.base.Provider.software_key): its interpreter,
    the packages installed beside it (each site-packages directory's entries and when it last changed:
    an install or removal changes both), the GPUs it is given (and the GPU driver, when it is given any)
    and its environment (a credential by its name only). "" when `python` is not a virtual environment's:
    a system Python's packages live where this does not look, so each of its nodes is checked."""
    root = python.parent.parent  # <venv>/bin/python, not resolved: that is the base Python
    try:
        parts = [str(python), str(python.resolve()), (root / "pyvenv.cfg").read_text()]
        sites = sorted(root.glob("lib*/python*/site-packages"))
        for site in sites:
            parts += [str(site), str(site.stat().st_mtime_ns), *sorted(os.listdir(site))]
    except OSError:
        return ""
    if not sites:
        return ""
    parts.append(f"gpus={num_gpus}")
    if num_gpus:  # a driver update can break CUDA with every package as it was
        try:
            parts.append(GPU_DRIVER.read_text())
        except OSError:
            parts.append("no driver")
    for name, value in sorted(env.items()):
        parts.append(name if any(word in name.upper() for word in _CREDENTIAL_WORDS) else f"{name}={value}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()
