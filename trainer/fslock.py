"""One process at a time on the node for work that fills a shared directory (a model build, a download)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` (created if missing) for the duration of the block."""
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
