"""The section's `debug: true` on the node: the libraries' own debug switches, set in the environment of
every process of the run (the fleet puts them in its Ray jobs' environment, so Ray Train's workers and
axolotl's child get them too), and named once in the node's log so a reader knows why it is so long."""

from __future__ import annotations

import sys
from collections.abc import Mapping

DEBUG_ENV: Mapping[str, str] = {
    "NCCL_DEBUG": "INFO",  # NCCL's rings, transports and errors between GPUs
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",  # torch.distributed's collective checks and DDP's unused params
    "TORCH_CPP_LOG_LEVEL": "INFO",  # c10d's own log (rendezvous, store timeouts)
    "TRANSFORMERS_VERBOSITY": "info",  # transformers' loading and trainer messages
    "DATASETS_VERBOSITY": "info",  # datasets' cache hits and builds (axolotl's preprocessing)
    "ACCELERATE_LOG_LEVEL": "info",  # accelerate's launcher (axolotl)
}
"""What `debug: true` sets, each one a library's documented switch."""


def announce(debug: bool) -> None:
    """Say in the node's log which debug switches this process runs with (nothing when debug is off)."""
    if debug:
        named = ", ".join(f"{k}={v}" for k, v in DEBUG_ENV.items())
        print(f"trainer: debug logging on (the section's debug: true): {named}", file=sys.stderr)
