"""What the fleet's layers below the providers know of Acme."""

from __future__ import annotations

from providers.acme.section import AcmeSection

from core.envnames import set_by_the_cloud
from jobs.clouds import Capability, CloudFacts, ProviderName

ACME = CloudFacts(
    name=ProviderName("acme"),
    section=AcmeSection,
    gpu_names={"A100-80GB": ("acme-a100-80",), "H100-SXM": ("acme-h100",)},
    location=Capability(False, "Acme does not say where an offer is"),
    node_env=set_by_the_cloud(names=("ACME_INSTANCE",), prefixes=("ACME_",)),
)
