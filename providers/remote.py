"""What every rented-node cloud shares, as a template: one instance per name, a Ray head reached with the
node's own token, terminate by name, and the steps of `list_offers` and `launch` around the vendor's own:
check the section, choose the cheapest fitting offer, refuse when none fits. A cloud says how to choose
offers, create an instance for one, list its records (its own model of the vendor's instance, parsed by
its client), read one, and destroy one.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar, cast

from pydantic import BaseModel

from core.errors import (
    AuthFailed,
    NoCapacity,
    NodeError,
    ProviderError,
    ProviderUnavailable,
    ProvisioningFailed,
    Unreachable,
)
from core.settings import CloudSettings
from jobs.images import registry_of
from providers.base import (
    INSTANCE_PREFIX,
    JUPYTER_PORT,
    JUPYTER_TOKEN_ENV,
    NO_SSH_ADVICE,
    SSH_KEY_ENV,
    LaunchRequest,
    NodeEndpoint,
    NodeInstance,
    NodeState,
    Offer,
    Provider,
    ProviderContext,
    Refusal,
    SshAccess,
    Unanswered,
    require_ours,
)
from providers.listing import SharedListing
from providers.node import reach
from providers.offers import DATA_CENTER, Choice, Priced
from providers.tokens import NodeTokens


class RentalSection(Protocol):
    """What the template reads of a cloud's section (RunPodSection, VastAISection)."""

    @property
    def gpu(self) -> str: ...

    @property
    def gpu_count(self) -> int: ...

    @property
    def jupyter(self) -> bool: ...

    @property
    def image(self) -> str | None: ...

    @property
    def private_image(self) -> bool: ...


S = TypeVar("S", bound=RentalSection)
R = TypeVar("R", bound=BaseModel)
"""The cloud's record of one instance (RunPodPod, VastInstance)."""
E = TypeVar("E", bound=ProviderError)


def made_nothing(error: E) -> E:
    """`error`, marked as a launch's that surely made nothing (a create may be asked again at once)."""
    error.made_nothing = True
    return error


@contextmanager
def before_create() -> Iterator[None]:
    """A launch's work before its create call: a provider error raised here made nothing."""
    try:
        yield
    except ProviderError as exc:
        made_nothing(exc)
        raise


def refused(error: ProviderError) -> bool:
    """Whether a failed create call surely made nothing: the vendor said no capacity or refused the key,
    or asked to be called later (a 429 saying when). A timeout, a 5xx, an answer that could not be read or
    any other error (RunPod answers some of its own failures as a GraphQL error) may still have made it."""
    if isinstance(error, ProviderUnavailable):
        return error.retry_after is not None
    return isinstance(error, (NoCapacity, AuthFailed))


class RemoteProvider(Provider, Generic[S, R]):
    """A cloud reached through its API (RunPod, vast.ai), whose section model is `S` and whose instance
    records are `R`s. Subclasses declare
    `vendor` and `settings_model` (besides `Provider`'s) and implement the hooks below."""

    vendor: ClassVar[str]
    """The cloud's name in messages ("RunPod", "vast.ai")."""
    settings_model: ClassVar[type[CloudSettings] | None]

    record_model: ClassVar[type[BaseModel]]
    """The model of `R`, to keep the list in the shared cache (providers.listing) and read it back."""

    def __init__(self, context: ProviderContext) -> None:
        super().__init__(context)
        self.tokens = NodeTokens(context.home, context.node_secrets)
        assert self.settings_model is not None, f"{type(self).__name__} declares no settings_model"
        default = context.cloud(self.name, self.settings_model).api_url()
        assert default is not None, f"{self.settings_model.__name__} declares no API_URL"
        self.api_url = context.urls.get(self.name, default)
        creds = sorted(context.credentials.items())
        keys = [value.get_secret_value() for key, value in creds if key in self.credential_names]
        self.listing: SharedListing[BaseModel] = SharedListing(
            context.listings,
            self.name.value,
            "|".join([self.api_url, *keys]),
            self.record_model,
        )

    def _records(self, name: str | None = None, fresh: bool = False) -> list[R]:
        """Live instances at the vendor (all of the account's, or those called `name`), oldest first: from
        the list every process shares for a moment (providers.listing), or the vendor's own when `fresh`."""
        rows = cast(list[R], self.listing.records(self._list, fresh))
        return [r for r in rows if name is None or self._name(r) == name]

    @abstractmethod
    def choose(self, section: S) -> Choice:
        """The offers for the section, filtered and priced, cheapest first (with the rejected, and why)."""

    @abstractmethod
    def _create(self, request: LaunchRequest, section: S, best: Priced) -> NodeInstance:
        """Create the instance `request.name` on the offer `best` and return it at once (PENDING). When the
        vendor's create call fails, return `self._created_anyway(request.name, <the translated error>)`."""

    @abstractmethod
    def _list(self) -> list[R]:
        """Every live instance of the account at the vendor, oldest first: one vendor call, its errors
        translated."""

    @abstractmethod
    def _name(self, record: R) -> str:
        """The fleet's name of the instance (RunPod's pod name, vast.ai's label)."""

    @abstractmethod
    def _destroy(self, record: R) -> None:
        """Ask the vendor to destroy it; an instance already gone is not an error."""

    @abstractmethod
    def _instance(self, record: R, probe: bool) -> NodeInstance:
        """The record as a NodeInstance; with `probe`, RUNNING only once its Jobs API answers, else PENDING
        with why not (`_unanswered`)."""

    @abstractmethod
    def _jobs_url(self, record: R) -> str | None:
        """Where the instance publishes its Ray Jobs API, if it does yet."""

    @abstractmethod
    def _published(self, record: R, port: int) -> str | None:
        """The HTTP URL where the instance publishes its container port `port`, if it does (yet)."""

    @abstractmethod
    def _ssh(self, record: R) -> SshAccess | None:
        """Where the instance publishes its SSH server, if it does (created with the fleet's key)."""

    login_advice: ClassVar[str]
    """Where the fleet's logins for private images are set on this cloud, for a refusal's message."""

    def registry_login(self, server: str) -> str | None:
        """What the create call names to pull from registry `server` (RunPod: a registry auth's id; vast.ai:
        docker login's arguments): never logged, never in an event. None: the fleet has no login there."""
        return None

    def refusal(self, section: BaseModel) -> Refusal | None:
        if not getattr(section, "private_image", False):
            return None
        try:
            if self._pull_login(cast(S, section)) is not None:
                return None
        except ProvisioningFailed as exc:  # a login the fleet has and cannot read (a malformed secret)
            return Refusal("private_image", str(exc))
        image = cast(S, section).image or ""
        why = f"image {image} is private and the fleet has no {self.vendor} login for {registry_of(image)}"
        return Refusal("private_image", f"{why}: {self.login_advice}")

    def _pull_login(self, section: S) -> str | None:
        """The create call's login for the section's private image; None for a public one (or none found)."""
        if not section.private_image or section.image is None:
            return None
        return self.registry_login(registry_of(section.image))

    def list_offers(self, section: BaseModel) -> list[Offer]:
        assert isinstance(section, self.section_model)
        return [
            Offer(self.name, p.candidate.offer_id, p.candidate.gpu, p.candidate.gpu_count, p.price_per_hour)
            for p in self.choose(cast(S, section)).fits
        ]

    def launch(self, request: LaunchRequest) -> NodeInstance:
        if not isinstance(request.section, self.section_model):
            raise ProvisioningFailed(f"{self.name} provider got a {type(request.section).__name__} section")
        section = cast(S, request.section)
        require_ours(request.name)
        refused = self.refusal(request.section)  # a setting gone since the submit: nothing is rented
        if refused is not None:
            raise made_nothing(ProvisioningFailed(f"{refused.key}: {refused.why}"))
        with before_create():
            fits = self.choose(section).fits
        if request.offer is not None:  # the offer chosen among the clouds, or none
            fits = tuple(p for p in fits if p.candidate.offer_id == request.offer)
        best = fits[0] if fits else None
        if best is None:
            wanted = f"{section.gpu} x{section.gpu_count}"
            if request.offer is not None:
                wanted = f"offer {request.offer} ({wanted}): it is no longer offered, or no longer fits"
            raise made_nothing(
                NoCapacity(f"no {self.vendor} offer fits the job (see `fleet offers`) for {wanted}")
            )
        try:
            return self._create_somewhere(request, section, best, fits)
        finally:
            self.listing.changed()  # made, or maybe made: the next look asks the vendor

    def _create_somewhere(
        self, request: LaunchRequest, section: S, best: Priced, fits: Sequence[Priced]
    ) -> NodeInstance:
        """Create from `best`. An offer in a data center the job named (`detail["data_center"]`, any of
        which will do) that has no machine there moves on to the same offer in the next one that fits; a
        NoCapacity names every data center tried."""
        if not best.candidate.detail.get(DATA_CENTER):
            return self._create(request, section, best)
        c = best.candidate
        same = [p for p in fits if (p.candidate.gpu, p.candidate.secure) == (c.gpu, c.secure)]
        full: list[str] = []
        for offer in [p for p in same if p.candidate.detail.get(DATA_CENTER)]:
            try:
                return self._create(request, section, offer)
            except NoCapacity as exc:
                full.append(f"{offer.candidate.detail[DATA_CENTER]}: {exc}")
        raise made_nothing(NoCapacity(f"no machine in any data center that fits: {'; '.join(full)}"))

    def _created_anyway(self, name: str, error: ProviderError) -> NodeInstance:
        """After a failed create call. A clear no (`refused`): raise `error`, marked as having made nothing.
        Else the create may have happened although the call failed, and whatever exists under the name is
        ours, so return it; else raise `error` (or the lookup's own error): the instance may yet show."""
        if refused(error):
            raise made_nothing(error) from None
        existing = self._get(name, fresh=True)
        if existing is not None:
            return existing
        raise error from None

    def _access_env(self, request: LaunchRequest, section: S) -> dict[str, str]:
        """The node's environment for the ways into it: the fleet's SSH public key (every node, when the
        fleet has one) and, on a head whose section asks for `jupyter`, its JupyterLab's fresh token."""
        env = {}
        if self.context.ssh_public_key:
            env[SSH_KEY_ENV] = self.context.ssh_public_key
        if section.jupyter and request.head is None:
            env[JUPYTER_TOKEN_ENV] = self.tokens.ensure_jupyter(request.name)
        return env

    def _live_record(self, name: str) -> R:
        records = self._records(name)
        if not records:
            raise NodeError(f"instance {name} is gone: {self.vendor} no longer lists it")
        return records[0]

    def _not_up(self, name: str, record: R) -> str | None:
        """Why the instance cannot be reached at all now (starting, stopped, failed), or None when it runs."""
        node = self._instance(record, probe=False)
        if node.state == NodeState.RUNNING:
            return None
        later = ": try again once it is up" if node.state == NodeState.PENDING else ""
        return f"instance {name} is {node.state.value.lower()} ({node.message}){later}"

    def ssh_access(self, name: str) -> SshAccess:
        record = self._live_record(name)
        access = self._ssh(record)
        if access is not None:
            return access
        raise NodeError(self._not_up(name, record) or f"instance {name} has no SSH: {NO_SSH_ADVICE}")

    def jupyter_url(self, name: str) -> str:
        token = self.tokens.jupyter(name)
        if token is None:
            raise NodeError(
                f"instance {name} runs no JupyterLab: set `jupyter: true` in the job's {self.name} section "
                "and run the job again"
            )
        record = self._live_record(name)
        why = self._not_up(name, record)
        url = None if why else self._jupyter_url(record)
        if url is None:
            raise NodeError(why or f"instance {name} does not publish JupyterLab's port {JUPYTER_PORT}")
        return f"{url}/lab?token={token}"

    def _jupyter_url(self, record: R) -> str | None:
        """Where the instance publishes its JupyterLab, if it does (yet)."""
        return self._published(record, JUPYTER_PORT)

    def pinned_certificate(self, name: str) -> Path | None:
        return self.tokens.tls_pin(name)

    def _endpoint_url(self, record: R) -> str | None:
        """The Jobs API URL to use now (a cloud may also require the instance to be running)."""
        return self._jobs_url(record)

    def _headers(self, name: str) -> dict[str, str] | None:
        token = self.tokens.get(name)
        return None if token is None else {"Authorization": f"Bearer {token}"}

    def _reach(self, name: str, url: str, headers: dict[str, str]) -> NodeEndpoint:
        """The endpoint at `url`, with what authenticates the node's end: its pinned certificate, when the
        fleet made one for it (a node reached by its address), else the authorities trusted for a proxy."""
        return NodeEndpoint(url, url, headers, self.tokens.tls_pin(name), self._proxy_authorities())

    def _proxy_authorities(self) -> Path | None:
        """The certificate authorities trusted for the cloud's HTTPS proxy in front of its nodes (None: the
        system's, or the cloud has no proxy)."""
        return None

    def _unanswered(self, record: R) -> Unanswered | None:
        """Why the instance's Ray head does not answer its Jobs API with the node's token (providers.reach
        tells a refused certificate from a booting node), or None once it does."""
        name = self._name(record)
        if self.tokens.head_of(name) is not None:
            return None  # a worker node serves no Jobs API: up once its container runs; its head's cluster
            # says whether it joined (the provision stage asks the head)
        url, headers = self._jobs_url(record), self._headers(name)
        if not url:
            return Unanswered(Unreachable.NETWORK, "it publishes no Jobs API port (yet)", name)
        if not headers:  # its token is gone from the store of node secrets: its head would say 401
            return Unanswered(Unreachable.HTTP, "the fleet holds no token for it", url)
        return reach(self._reach(name, url, headers), headers)

    def get(self, name: str) -> NodeInstance | None:
        return self._get(name)

    def _get(self, name: str, fresh: bool = False) -> NodeInstance | None:
        records = self._records(name, fresh)
        if not records:
            return None
        for extra in records[1:]:  # a retried create made a second one: keep exactly one (the first)
            self._destroy(extra)
            self.listing.changed()
        return self._instance(records[0], probe=True)

    def endpoint(self, name: str) -> NodeEndpoint:
        records = self._records(name)
        url = self._endpoint_url(records[0]) if records else None
        headers = self._headers(name)
        if url is None or headers is None:
            raise NodeError(f"instance {name} has no reachable Ray head (yet)")
        return self._reach(name, url, headers)

    def endpoint_at(self, name: str, url: str | None) -> NodeEndpoint:
        """The head at `url` (found by `endpoint` once: RunPod's proxy URL names the pod, and a vast.ai
        instance keeps its mapped ports while it runs; stopped, it is lost and replaced), with its token."""
        if not url:
            return self.endpoint(name)
        headers = self._headers(name)
        if headers is None:
            raise NodeError(f"instance {name} has no token here: the fleet did not make it")
        return self._reach(name, url, headers)

    def terminate(self, name: str) -> None:
        records = self._records(name) or self._records(name, fresh=True)  # one just made may not show yet
        for record in records:
            self._destroy(record)
        self.listing.changed()

    def gone(self, name: str, fresh: bool = False) -> bool:
        return not self._records(name, fresh)

    def forget(self, name: str) -> None:
        self.tokens.forget(name)

    def list_instances(self) -> list[NodeInstance]:
        # The reaper's look (each reap_interval_s) and the CLI's: the vendor's own, kept for the others.
        ours = [r for r in self._records(fresh=True) if self._name(r).startswith(INSTANCE_PREFIX)]
        return [self._instance(r, probe=False) for r in ours]
