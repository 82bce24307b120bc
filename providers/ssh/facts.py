"""What the job's data knows of the operator's own machines, declared here and handed to it by the
registry: the `ssh:` section (jobs.clouds). Its GPU types are the fleet's own names (the pools file's), and
it is `owned`: no offers, so never among a `cloud:` section's clouds unless one names a pool."""

from __future__ import annotations

from jobs.clouds import Capability, CloudFacts, ProviderName
from providers.ssh.section import SshSection

SSH = CloudFacts(
    name=ProviderName("ssh"),
    section=SshSection,
    location=Capability(False, "a pool's machines say nothing of where they are"),
    owned=True,
)
