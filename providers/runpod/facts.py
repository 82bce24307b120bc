"""What the job's data and the fleet's checks know of RunPod, declared here and handed to them by the
registry: its section model and GPU names (jobs.clouds), the names it sets in a pod's environment
(core.envnames)."""

from __future__ import annotations

from core.envnames import set_by_the_cloud
from jobs.clouds import Capability, CloudFacts, ProviderName
from providers.runpod.section import RunPodSection

RUNPOD = CloudFacts(
    name=ProviderName("runpod"),
    section=RunPodSection,
    # RunPod's GPU ids are the names NVIDIA's driver reports: one name per type.
    gpu_names={
        "B200": ("NVIDIA B200",),
        "H200": ("NVIDIA H200",),
        "H100-SXM": ("NVIDIA H100 80GB HBM3",),
        "H100-PCIE": ("NVIDIA H100 PCIe",),
        "H100-NVL": ("NVIDIA H100 NVL",),
        "A100-80GB": ("NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"),
        "L40S": ("NVIDIA L40S",),
        "L40": ("NVIDIA L40",),
        "A40": ("NVIDIA A40",),
        "L4": ("NVIDIA L4",),
        "RTX-6000-ADA": ("NVIDIA RTX 6000 Ada Generation",),
        "RTX-A6000": ("NVIDIA RTX A6000",),
        "RTX-A5000": ("NVIDIA RTX A5000",),
        "RTX-A4000": ("NVIDIA RTX A4000",),
        "RTX-5090": ("NVIDIA GeForce RTX 5090",),
        "RTX-4090": ("NVIDIA GeForce RTX 4090",),
        "RTX-3090": ("NVIDIA GeForce RTX 3090",),
    },
    # Asked to avoid places, its offers are per data center, each saying where it is (`dataCenters`).
    location=Capability(True),
    node_env=set_by_the_cloud(
        # the pod the failsafe terminates (and its private host name), with the pod's own key
        names=("RUNPOD_POD_ID", "RUNPOD_API_KEY"),
        prefixes=("RUNPOD_",),
    ),
)
