"""trainfleet's axolotl plugin, named in the `plugins:` of every config trainer.axolotl_run gives axolotl.

axolotl loads it by its dotted path on every process that trains (each `accelerate` process, each Ray
Train worker) and asks it for callbacks once the HF Trainer exists; the callback is
trainer.axolotl_callback's. Only this module imports axolotl, so nothing else of the node needs it.
"""

from __future__ import annotations

import os
from typing import Any

from axolotl.integrations.base import BasePlugin  # type: ignore[import-not-found,unused-ignore]


class TrainfleetPlugin(BasePlugin):  # type: ignore[misc,unused-ignore]  # axolotl is not type-checked here
    """Adds trainfleet's callback: progress lines, loss watchdog, eval samples, final metrics."""

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        from trainer.axolotl_callback import FleetCallback

        return [FleetCallback.from_env(trainer, cfg, dict(os.environ))]
