"""`python -m trainer axolotl-check`: an axolotl config checked with axolotl's own config model.

Run by `fleet validate` with an interpreter that has axolotl (the `trainfleet[axolotl]` extra, or the
axolotl environment), never inside the fleet: axolotl pins its own torch, transformers and peft. It reads
the config as JSON on stdin and prints one JSON line, ``{"axolotl": VERSION, "problems": [{"path",
"message"}]}``: each problem with the key path as a YAML file writes it (``datasets[0].type``). A
validator of axolotl's that raises something other than a validation error (a deprecated key raises
DeprecationWarning) is one problem without a path. Exit 0 when it could check, 2 when axolotl is missing.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from importlib import metadata
from typing import Any


def key_path(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as the YAML key path: ('datasets', 0, 'type') -> datasets[0].type."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and "[" not in part and "function-" not in part:
            out += f".{part}" if out else part
    return out


def check(config: dict[str, Any]) -> list[dict[str, str]]:
    """axolotl's verdict on `config`: its problems (empty: valid)."""
    from axolotl.utils.schemas.config import AxolotlInputConfig
    from pydantic import ValidationError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its advice is printed on the node when it trains
            AxolotlInputConfig(**config)
    except ValidationError as exc:
        return [{"path": key_path(tuple(e["loc"])), "message": e["msg"]} for e in exc.errors()]
    except Exception as exc:  # noqa: BLE001 - a validator of axolotl's raised: that is its verdict
        named = [k for k in re.findall(r"`([A-Za-z0-9_]+)`", str(exc)) if k in config]  # the key it names
        return [{"path": named[0] if named else "", "message": f"{type(exc).__name__}: {exc}"}]
    return []


def main() -> int:
    try:
        version = metadata.version("axolotl")
    except metadata.PackageNotFoundError:
        print("trainer: error: axolotl is not installed in this environment", file=sys.stderr)
        return 2
    config = json.loads(sys.stdin.read())
    print(json.dumps({"axolotl": version, "problems": check(config)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
