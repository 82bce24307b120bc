"""What the job's data and the fleet's checks know of vast.ai, declared here and handed to them by the
registry: its section model and GPU names (jobs.clouds), the names it sets in an instance's environment
(core.envnames)."""

from __future__ import annotations

from core.envnames import set_by_the_cloud
from jobs.clouds import CloudFacts, ProviderName
from providers.vastai.section import VastAISection

VASTAI = CloudFacts(
    name=ProviderName("vastai"),
    section=VastAISection,
    # vast.ai names a model, not its size: "A100 PCIE" is 40 or 80 GB (the offer's memory tells them apart).
    gpu_names={
        "B200": ("B200",),
        "H200": ("H200", "H200 NVL"),
        "H100-SXM": ("H100 SXM",),
        "H100-PCIE": ("H100 PCIE",),
        "H100-NVL": ("H100 NVL",),
        "A100-80GB": ("A100 PCIE", "A100 SXM4"),
        "A100-40GB": ("A100 PCIE", "A100 SXM4"),
        "L40S": ("L40S",),
        "L40": ("L40",),
        "A40": ("A40",),
        "L4": ("L4",),
        "RTX-6000-ADA": ("RTX 6000Ada",),
        "RTX-A6000": ("RTX A6000",),
        "RTX-A5000": ("RTX A5000",),
        "RTX-A4000": ("RTX A4000",),
        "RTX-5090": ("RTX 5090",),
        "RTX-4090": ("RTX 4090",),
        "RTX-3090": ("RTX 3090",),
    },
    node_env=set_by_the_cloud(
        # the instance the failsafe destroys, with the instance's own key
        names=("CONTAINER_ID", "CONTAINER_API_KEY"),
        prefixes=("VAST_", "CONTAINER_"),
    ),
)
