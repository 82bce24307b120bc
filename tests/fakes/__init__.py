"""Local HTTP fakes of the clouds' APIs (RunPod GraphQL, vast.ai REST) for wire-level and fault tests.

In a test: `with FakeRunPod(api_key=KEY, home=tmp_path, nodes="none") as fake: ... fake.url ...`.
From a shell: `python -m tests.fakes serve runpod|vastai --port N [--home DIR] [--nodes ray|none]`.
"""

from __future__ import annotations

from tests.fakes.base import FakeCloud, Fault, Instance
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vastai import FakeVastAI

FAKES: dict[str, type[FakeCloud]] = {"runpod": FakeRunPod, "vastai": FakeVastAI}

__all__ = ["FAKES", "FakeCloud", "FakeRunPod", "FakeVastAI", "Fault", "Instance"]
