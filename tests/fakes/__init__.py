"""Local HTTP fakes of the clouds' APIs (RunPod GraphQL, vast.ai REST) and of the Hugging Face Hub.

In a test: `with FakeRunPod(api_key=KEY, home=tmp_path, nodes="none") as fake: ... fake.url ...`, or
`with FakeHub(home=tmp_path, token=TOKEN) as hub: ... hub.url ...` (the Hub is not a cloud: no instances).
Discord: `with FakeDiscord(token=T) as fake:` and `discord.http.Route.BASE = f"{fake.url}/api/v10"`.
From a shell: `python -m tests.fakes serve runpod|vastai|hub|discord --port N [...]`.
"""

from __future__ import annotations

from tests.fakes.base import FakeCloud, Fault, Instance
from tests.fakes.discord import FakeDiscord
from tests.fakes.hub import FakeHub
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vastai import FakeVastAI

FAKES: dict[str, type[FakeCloud]] = {"runpod": FakeRunPod, "vastai": FakeVastAI}

__all__ = ["FAKES", "FakeCloud", "FakeDiscord", "FakeHub", "FakeRunPod", "FakeVastAI", "Fault", "Instance"]
