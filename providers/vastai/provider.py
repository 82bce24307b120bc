"""The `vastai` provider: on-demand and interruptible (bid) instances on vast.ai, labelled tf-<run>-<attempt>.

An instance runs a Ray head with token auth (providers.bootstrap's start script as its `onstart`) and
publishes the Jobs API port (and JupyterLab's, with `jupyter: true`) through its TLS front; the fleet reaches
it at the host's public address and mapped port over HTTPS, trusting only the certificate it made for that
instance (providers.tokens), and `fleet jupyter` gives an https URL and that certificate.

Money: the fleet's bids are per GPU (`max_bid_per_gpu`), vast.ai's are per machine. An offer's `min_bid`
(and `dph_total` in a bid search) is for the whole machine, so the minimum bid per GPU is
`min_bid / num_gpus`, and a rental bids `price = bid_per_gpu * num_gpus`.
vast.ai has no server-side deadline like RunPod's `terminateAfter`, but it gives every instance its own id
and an API key that may manage it (CONTAINER_ID, CONTAINER_API_KEY in the container). So the node's failsafe
(providers.onnode.failsafe) destroys the instance `terminate_after` seconds after it booted, or once the
fleet's heartbeat has stopped for the fleet's `node_heartbeat_timeout_s`, should the fleet be gone; the
fleet's own terminate and the reaper come first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import ClassVar

import requests
from pydantic import BaseModel

from core.errors import (
    AuthFailed,
    NoCapacity,
    ProviderError,
    ProviderUnavailable,
    ProvisioningFailed,
)
from core.settings import CloudSettings
from jobs.clouds import CloudFacts
from jobs.sections import ProviderName, SectionBase
from providers.base import (
    JUPYTER_PORT,
    JUPYTER_TOKEN_ENV,
    SSH_KEY_ENV,
    LaunchRequest,
    NodeInstance,
    NodeState,
    ProviderContext,
    SshAccess,
    Unanswered,
)
from providers.bootstrap import (
    JOBS_PORT,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TOKEN_ENV,
    failsafe_env,
    node_setup_env,
    start_script,
)
from providers.offers import Candidate, Choice, Priced, Rule, choose
from providers.onnode import tlsfront
from providers.onnode.failsafe import VAST_URL_ENV
from providers.remote import RemoteProvider
from providers.vastai.client import MB_PER_GB, VastAIClient, offer_query
from providers.vastai.facts import VASTAI
from providers.vastai.models import VastInstance, VastOffer, first_number
from providers.vastai.section import VastAISection
from providers.vastai.settings import REGISTRY_LOGINS, VastAISettings, registry_logins

log = logging.getLogger(__name__)

CREDENTIAL = "VAST_API_KEY"
NO_CAPACITY_ERRORS = ("no_such_ask",)
QUOTA_ERROR = "search_quota_exceeded"
NO_CAPACITY_MARK = "no longer available"
SSH_PORT_KEY = "22/tcp"  # direct SSH: the container's port 22 on the host's public address
PENDING_STATUSES = (None, "", "created", "loading", "scheduling")
STOPPED_STATUSES = ("stopped", "frozen")  # stopped by its owner, or outbid; storage still bills
# Docker's words (in status_msg) for a pull that will never work: vast.ai leaves such an instance `loading`,
# billing, for as long as it is not destroyed. A pull that may yet work (a registry's rate limit, a timeout)
# says none of these.
PULL_NEVER_WORKS = (
    "pull access denied",
    "manifest unknown",
    "repository does not exist",
    "invalid reference format",
    "unauthorized: ",
)


def _vendor_message(response: requests.Response) -> tuple[str, str]:
    """(error code, message) from vast.ai's `{"error": ..., "msg": ...}` envelope, when there is one."""
    try:
        body = response.json()
    except ValueError:
        return "", response.reason or ""
    if not isinstance(body, dict):
        return "", response.reason or ""
    return str(body.get("error") or ""), str(body.get("msg") or response.reason or "")


def translate(exc: requests.RequestException) -> ProviderError:
    """The library's failure as one of the fleet's errors. Messages carry the status and vast.ai's own
    message, never the request (its URL and headers are the library's business)."""
    if isinstance(exc, requests.Timeout):
        return ProviderUnavailable("vast.ai did not answer in time")
    if isinstance(exc, requests.ConnectionError):
        return ProviderUnavailable(f"vast.ai unreachable: {type(exc).__name__}")
    response = exc.response
    if response is None:  # no answer that could be read: the request may have been carried out
        return ProviderUnavailable(f"vast.ai request failed: {type(exc).__name__}")
    status = response.status_code
    code, message = _vendor_message(response)
    if status in (401, 403):
        return AuthFailed(f"vast.ai refused the API key (HTTP {status}): {message or code}")
    if status == 429 and code == QUOTA_ERROR:  # the library does not retry these: say when to
        wait = _retry_after(response)
        return ProviderUnavailable(f"vast.ai search quota exceeded: {message}", retry_after=wait)
    if status == 429 or status >= 500:
        return ProviderUnavailable(f"vast.ai API {status}: {message}", retry_after=_retry_after(response))
    if code in NO_CAPACITY_ERRORS or NO_CAPACITY_MARK in message.lower():
        return NoCapacity(f"vast.ai: {message}")
    return ProviderError(f"vast.ai API {status}: {code or 'error'}: {message}")


def _retry_after(response: requests.Response) -> float | None:
    """The Retry-After header in seconds (vast.ai sends a number), or None."""
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None


def vendor_rules(section: VastAISection, offers: dict[str, VastOffer]) -> list[Rule]:
    """vast.ai-only asks, checked again on our side: the API only warns about filter fields it does not
    know, so a renamed field would otherwise drop a filter silently."""
    unknown = VastOffer()

    def check(test: Callable[[VastOffer], str | None]) -> Rule:
        return lambda c: test(offers.get(c.offer_id, unknown))

    def reliability(o: VastOffer) -> str | None:
        have = first_number(o.reliability2, o.reliability)
        if have is None or have < section.min_reliability:
            return f"reliability {have if have is not None else 'unknown'} < {section.min_reliability:g}"
        return None

    def verified(o: VastOffer) -> str | None:
        return "host not verified; verified_only is set" if section.verified_only and not o.verified else None

    def gpu_ram(o: VastOffer) -> str | None:
        need = section.min_gpu_ram_in_gb
        mb = first_number(o.gpu_ram)
        if need is None or (mb is not None and mb / MB_PER_GB >= need):
            return None
        return f"GPU memory {'unknown' if mb is None else f'{mb / MB_PER_GB:g} GB'} < {need} GB"

    def cuda(o: VastOffer) -> str | None:
        need = section.min_cuda_version
        have = first_number(o.cuda_max_good)
        if need is None or (have is not None and have >= need):
            return None
        return f"CUDA {have if have is not None else 'unknown'} < {need:g}"

    return [check(reliability), check(verified), check(gpu_ram), check(cuda)]


class VastAIProvider(RemoteProvider[VastAISection, VastInstance]):
    """Instances on vast.ai, through the official `vastai` library."""

    name: ClassVar[ProviderName] = VASTAI.name
    section_model: ClassVar[type[SectionBase]] = VASTAI.section
    credential_names: ClassVar[tuple[str, ...]] = (CREDENTIAL,)
    optional_credentials: ClassVar[tuple[str, ...]] = (REGISTRY_LOGINS,)
    vendor: ClassVar[str] = "vast.ai"
    login_advice: ClassVar[str] = (
        f'put one in {REGISTRY_LOGINS} (a mapping of registry to user:token, e.g. {{"ghcr.io": '
        '"acme-bot:<a read-only token>"}) in the environment or the fleet\'s secrets file'
    )
    facts: ClassVar[CloudFacts | None] = VASTAI
    settings_model: ClassVar[type[CloudSettings] | None] = VastAISettings
    record_model: ClassVar[type[BaseModel]] = VastInstance

    def __init__(self, context: ProviderContext) -> None:
        super().__init__(context)
        self.client = VastAIClient(context.credential(CREDENTIAL), self.api_url, context.api_timeouts)

    def registry_login(self, server: str) -> str | None:
        try:
            return registry_logins(self.context.credentials.get(REGISTRY_LOGINS)).get(server)
        except ValueError as exc:  # a bad secret refuses the jobs that need it, not the cloud
            raise ProvisioningFailed(str(exc)) from None

    # offers ---------------------------------------------------------------------------------------
    def choose(self, section: VastAISection) -> Choice:
        """The cheapest offers vast.ai finds for the section, checked and priced, cheapest first."""
        bid = section.pod_type == "INTERRUPTABLE"
        secure = {"SECURE": True, "COMMUNITY": False}.get(section.cloud_type)
        query = offer_query(
            section.gpu,
            section.gpu_count,
            min_vcpus=section.min_vcpu_count,
            min_memory_gb=section.min_memory_in_gb,
            min_download=section.min_download,
            min_upload=section.min_upload,
            min_disk_gb=section.container_disk_in_gb,
            min_reliability=section.min_reliability,
            min_gpu_ram_gb=section.min_gpu_ram_in_gb,
            min_cuda=section.min_cuda_version,
            verified_only=section.verified_only,
            datacenter=secure,
        )
        try:
            rows = self.client.search_offers(query, bid=bid)
        except requests.RequestException as exc:
            raise translate(exc) from None
        offers = {str(o.id): o for o in rows if o.id is not None}
        candidates = [self._candidate(o, bid) for o in offers.values()]
        return choose(section, section.gpu, candidates, vendor_rules(section, offers))

    def _candidate(self, offer: VastOffer, bid: bool) -> Candidate:
        count = int(offer.num_gpus or 1)
        dph = first_number(offer.dph_total)
        # In a bid search dph_total is the machine's minimum bid; min_bid is, everywhere.
        machine_bid = first_number(offer.min_bid, offer.dph_total if bid else None)
        memory_mb = first_number(offer.cpu_ram)
        return Candidate(
            provider=self.name,
            offer_id=str(offer.id),
            gpu=str(offer.gpu_name),
            gpu_count=count,
            on_demand_per_hour=None if bid else dph,
            min_bid_per_gpu=round(machine_bid / count, 6) if machine_bid is not None else None,
            vcpus=first_number(offer.cpu_cores_effective) or 0.0,
            memory_gb=memory_mb / MB_PER_GB if memory_mb is not None else 0.0,
            secure=bool(offer.datacenter) or offer.hosting_type == 1,
            download_mbps=first_number(offer.inet_down),
            upload_mbps=first_number(offer.inet_up),
            disk_gb=first_number(offer.disk_space),
            detail={
                "reliability": str(offer.shown_reliability()),
                "verified": str(offer.verified),
                "cuda": str(offer.cuda_max_good),
                "location": str(offer.geolocation),
                "gpu_memory_gb": f"{gpu_mb / MB_PER_GB:g}" if (gpu_mb := first_number(offer.gpu_ram)) else "",
            },
        )

    # lifecycle ------------------------------------------------------------------------------------
    def _create(self, request: LaunchRequest, section: VastAISection, best: Priced) -> NodeInstance:
        token = self.tokens.ensure(request.name)
        cert, key = self.tokens.ensure_tls(request.name)  # its Jobs API's TLS front's, pinned by the fleet
        deadline = section.terminate_after if section.terminate_after != -1 else None
        env = {
            **request.node_env(section.env),
            TOKEN_ENV: token,
            TLS_CERT_ENV: tlsfront.env_value(cert),
            TLS_KEY_ENV: tlsfront.env_value(key),
            f"-p {JOBS_PORT}:{JOBS_PORT}": "1",
            VAST_URL_ENV: self.api_url,  # where the node's failsafe destroys it (a fake's in tests)
            **failsafe_env(deadline, request.heartbeat_timeout_s),
            # what the image lacks of the node's software, installed at boot
            **node_setup_env(request.software, tls=True),  # JupyterLab too behind the TLS front
            **self._access_env(request, section),  # the fleet's SSH key, JupyterLab's token
        }
        if JUPYTER_TOKEN_ENV in env:
            env[f"-p {JUPYTER_PORT}:{JUPYTER_PORT}"] = "1"
        # A bid is per machine on vast.ai: the per-GPU bid (never above the cap) times the GPUs.
        price = best.price_per_hour if best.bid_per_gpu is not None else None
        offer_id, image = int(best.candidate.offer_id), self.context.image(section.image, request.software)
        onstart = start_script(self.name, tls=True)
        try:  # only the call and the reading of its answer: a KeyError etc. below is the answer's
            ident = self.client.create_instance(
                offer_id,
                label=request.name,
                image=image,
                disk_gb=section.container_disk_in_gb,
                env=env,
                onstart=onstart,
                price=price,
                ssh=SSH_KEY_ENV in env,
                login=self._pull_login(section),
            )
        except requests.RequestException as exc:
            return self._created_anyway(request.name, translate(exc))
        except (KeyError, TypeError, ValueError):  # an answer without the new instance's id: maybe made
            unread = ProviderUnavailable("vast.ai's answer to the create names no instance")
            return self._created_anyway(request.name, unread)
        if SSH_KEY_ENV in env:
            self._attach_key(ident, env[SSH_KEY_ENV])
        return NodeInstance(
            request.name,
            self.name,
            str(ident),
            NodeState.PENDING,
            time.time(),
            best.price_per_hour,
            "created",
        )

    def _list(self) -> list[VastInstance]:
        try:
            rows = self.client.show_instances(pace=self.listing.pace)
        except requests.RequestException as exc:
            raise translate(exc) from None
        return sorted(rows, key=lambda r: r.id)

    def _instance(self, row: VastInstance, probe: bool) -> NodeInstance:
        status = row.actual_status
        unanswered: Unanswered | None = None  # why its head did not answer the probe
        note = str(row.status_msg or "").strip()
        if status in STOPPED_STATUSES:
            state, message = (
                NodeState.STOPPED,
                f"instance {status} (stopped or outbid){': ' + note if note else ''}",
            )
        elif status == "exited" and row.intended_status == "stopped":
            state, message = NodeState.STOPPED, "instance stopped"
        elif status in ("loading", None, "") and any(w in note.lower() for w in PULL_NEVER_WORKS):
            state, message = NodeState.FAILED, f"its image cannot be pulled: {note}"
        elif status in ("exited", "offline", "unknown"):
            state, message = (
                NodeState.FAILED,
                f"instance {status}; it will not come up{': ' + note if note else ''}",
            )
        elif status in PENDING_STATUSES or self._jobs_url(row) is None:
            state, message = NodeState.PENDING, f"starting ({status or 'creating'})"
        elif probe and (unanswered := self._unanswered(row)) is not None:
            state, message = NodeState.PENDING, f"container up, Ray head not answering yet: {unanswered}"
        else:
            state, message = NodeState.RUNNING, "ready"
        started = first_number(row.start_date)
        created = started if started is not None else time.time() - 60 * (first_number(row.uptime_mins) or 0)
        return NodeInstance(
            str(row.label or ""),
            self.name,
            str(row.id),
            state,
            created,
            first_number(row.dph_total) or 0.0,
            message,
            first_number(row.gpu_util),  # may be null
            unanswered=unanswered,
        )

    def _name(self, record: VastInstance) -> str:
        return str(record.label or "")

    def _attach_key(self, ident: int, public_key: str) -> None:
        """Let the fleet's key into the new instance, as vast.ai attaches a key to one (its account's keys
        it attaches itself). A failure does not fail the launch: the node's start script also installs the
        key from its environment (PUBLIC_KEY)."""
        try:
            self.client.attach_ssh(ident, public_key)
        except requests.RequestException as exc:
            log.warning("vast.ai %s: attaching the fleet's SSH key failed: %s", ident, translate(exc))

    def _jobs_url(self, row: VastInstance) -> str | None:
        """The Jobs API's TLS front at the host's address: HTTPS, the instance's own certificate pinned."""
        url = self._published(row, JOBS_PORT)
        return None if url is None else "https://" + url.removeprefix("http://")

    def _jupyter_url(self, row: VastInstance) -> str | None:
        """JupyterLab's port is the TLS front's too: HTTPS, with the instance's own certificate."""
        url = self._published(row, JUPYTER_PORT)
        return None if url is None else "https://" + url.removeprefix("http://")

    def _host_port(self, row: VastInstance, key: str) -> str | None:
        mapped = (row.ports or {}).get(key) or []
        return mapped[0].HostPort if mapped and mapped[0] is not None else None

    def _published(self, row: VastInstance, port: int) -> str | None:
        ip, host_port = row.public_ipaddr, self._host_port(row, f"{port}/tcp")
        if not ip or not host_port:
            return None
        return f"http://{ip.strip()}:{host_port}"

    def _ssh(self, row: VastInstance) -> SshAccess | None:
        """Direct SSH (the host's public address and its port for the container's 22) when the instance
        has it, else vast.ai's SSH proxy (ssh_host, ssh_port), as vast.ai's own `ssh-url` chooses."""
        ip, direct = row.public_ipaddr, self._host_port(row, SSH_PORT_KEY)
        if ip and direct and direct.isdigit():
            return SshAccess(ip.strip(), int(direct))
        if row.ssh_host and row.ssh_port:
            return SshAccess(row.ssh_host.strip(), int(row.ssh_port))
        return None

    def _endpoint_url(self, record: VastInstance) -> str | None:
        return self._jobs_url(record) if record.actual_status == "running" else None

    def _destroy(self, record: VastInstance) -> None:
        try:
            self.client.destroy_instance(record.id)
        except requests.HTTPError as exc:
            if exc.response is None or exc.response.status_code != 404:  # 404: already gone
                raise translate(exc) from None
        except requests.RequestException as exc:
            raise translate(exc) from None
