"""The `ssh` provider: the operator's own machines, in pools (providers.ssh.pools), reached over SSH.

An instance here is a node started on a machine the run claimed whole (providers.ssh.claims): launch finds
the free machines that fit (providers.ssh.fit), the smallest first, connects to each in turn until it has
as many as the run's nodes (a machine that is down, or whose host key or login is refused, is passed over
and named), claims them all at once (a cluster's nodes each its own machine), and starts the node on the
first: a rented node's start script, run as the pool's user (providers.ssh.node). A cluster's other nodes
are started on the machines claimed with it when the provision stage asks for them, and join the head at
its machine's address. The claim records the node (ports, temp dir, session), so that any process of the
fleet finds it: it reaches the head's Jobs API through a tunnel of its own (providers.ssh.links), over
the connection whose host key the fleet checked, with the node's token.

An instance exists once its node is started (`get`); a machine claimed for a node not started yet is
listed PENDING, so that the reaper gives back what a crash left claimed. Terminate stops the node (its
processes, its files) and gives the machine back; a machine that does not answer keeps its claim, and the
terminate is tried again, so no run lands on GPUs a stray node still holds.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import ClassVar

from pydantic import BaseModel

from core.errors import (
    AuthFailed,
    ConfigError,
    MachinesHeld,
    NoCapacity,
    NodeError,
    ProviderUnavailable,
    ProvisioningFailed,
    Unreachable,
)
from core.settings import CloudSettings
from jobs.clouds import CloudFacts, ProviderName
from jobs.sections import SectionBase
from providers import bootstrap
from providers.base import (
    INSTANCE_PREFIX,
    LaunchRequest,
    NodeEndpoint,
    NodeInstance,
    NodeState,
    Offer,
    Provider,
    ProviderContext,
    Refusal,
    Unanswered,
    require_ours,
)
from providers.node import reach
from providers.offers import HELD_BY
from providers.remote import made_nothing
from providers.ssh import fit
from providers.ssh.claims import Claim, Claims
from providers.ssh.connect import HostKeyRefused, MachineDown
from providers.ssh.facts import SSH
from providers.ssh.links import Links
from providers.ssh.node import PoolNode, alive, log_tail, start_node, stop
from providers.ssh.pools import Machine, Pools, read_pools
from providers.ssh.section import SshSection
from providers.ssh.settings import SshSettings
from providers.tokens import NodeTokens

log = logging.getLogger(__name__)
NO_POOLS = (
    "the fleet has no pools: set ssh_pools_file (FLEET_SSH_POOLS_FILE) to the file that declares them "
    "(README, Your own machines)"
)


def offer_of(machine: Machine) -> str:
    """The machine as an offer (`list_offers`; a `cloud:` job's choice, which `launch` then claims):
    POOL/MACHINE."""
    return f"{machine.pool}/{machine.name}"


def address(machine: Machine) -> str:
    """The machine's IP address as the fleet resolves its host: what its node advertises to the cluster's
    others (Ray wants an address, not a name), and where they join its head."""
    try:
        return str(socket.getaddrinfo(machine.host, machine.port, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as exc:
        raise MachineDown(f"{machine.name}: its host does not resolve ({exc})") from None


class SshProvider(Provider):
    """Nodes on the operator's machines, one per claimed machine."""

    name: ClassVar[ProviderName] = SSH.name
    section_model: ClassVar[type[SectionBase]] = SshSection
    facts: ClassVar[CloudFacts | None] = SSH
    settings_model: ClassVar[type[CloudSettings] | None] = SshSettings

    def __init__(self, context: ProviderContext) -> None:
        super().__init__(context)
        own = context.cloud(self.name, SshSettings)
        self.pools_file = own.ssh_pools_file
        self.tokens = NodeTokens(context.home, context.node_secrets)
        self.links = Links(own.ssh_known_hosts)
        self.claims = Claims(context.client) if context.client is not None else None

    def pools(self) -> Pools:
        """The pools as the file declares them now (the operator may edit it between runs); ProvisioningFailed
        saying why when there are none to read."""
        if self.pools_file is None:
            raise ProvisioningFailed(NO_POOLS)
        try:
            return read_pools(self.pools_file)
        except ConfigError as exc:
            raise ProvisioningFailed(f"the pools file is not valid: {exc}") from None

    def _claims(self) -> Claims:
        if self.claims is None:
            raise ProvisioningFailed(
                "pool machines are claimed in the fleet's Redis, and this process has none"
            )
        return self.claims

    def unavailable(self) -> str | None:
        try:
            self.pools()  # (the claims' Redis: a submit's check may come before it connects)
        except ProvisioningFailed as exc:
            return str(exc)
        return None

    def refusal(self, section: SectionBase) -> Refusal | None:
        assert isinstance(section, SshSection)
        try:
            return fit.refusal(self.pools(), section)
        except ProvisioningFailed as exc:
            return Refusal("pool", str(exc))

    def list_offers(self, section: BaseModel) -> list[Offer]:
        """Every machine of the section's pool that fits, the smallest first (a `cloud:` job's offers,
        POOL/MACHINE); one another run holds says which (detail HELD_BY)."""
        assert isinstance(section, SshSection)
        pools = self.pools()
        if section.pool not in pools.pools:
            return []
        held = self.claims.held(section.pool) if self.claims is not None else {}
        offers = []
        for m in fit.fitting(pools.machines(section.pool), section):  # the smallest first
            holder = {HELD_BY: held[m.name].run_id} if m.name in held else {}
            offers.append(
                Offer(self.name, offer_of(m), m.gpu, m.gpus, m.hourly_usd, {"pool": m.pool} | holder)
            )
        return offers

    # -- launch ---------------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> NodeInstance:
        section = request.section
        if not isinstance(section, SshSection):
            raise ProvisioningFailed(f"ssh provider got a {type(section).__name__} section")
        require_ours(request.name)
        refused = self.refusal(section)  # the pools file may have changed since the submit
        if refused is not None:
            raise made_nothing(ProvisioningFailed(f"{refused.key}: {refused.why}"))
        claims = self._claims()
        pools = self.pools()
        if request.head is None:
            machine = self._claim(pools, section, request)
        else:
            machine = self._reserved(pools, section.pool, request.name)
        node = self._start(pools, section, request, machine)  # failed: the claim stays, for terminate to end
        claims.started(section.pool, machine.name, node)
        return self._instance(
            machine, Claim(instance=node.instance, run_id=request.run_id, since=time.time())
        )

    def _claim(self, pools: Pools, section: SshSection, request: LaunchRequest) -> Machine:
        """Claim the machines of the run's nodes (the head's, and a cluster's others with it); the head's."""
        claims = self._claims()
        names = [request.name]
        if section.num_nodes > 1:  # tf-<run>-<attempt>-0: the others are -1 .. -<num_nodes - 1>
            base = request.name.rsplit("-", 1)[0]
            names = [f"{base}-{k}" for k in range(section.num_nodes)]
        machines = fit.fitting(pools.machines(section.pool), section)
        if request.offer is not None:  # a `cloud:` job's choice: that machine, or none
            machines = [m for m in machines if offer_of(m) == request.offer]
            if not machines:
                raise made_nothing(NoCapacity(f"{request.offer}: no longer a machine of the pool that fits"))
        held = claims.held(section.pool)
        mine = [m for m in machines if m.name in held and held[m.name].instance in names]
        if len(mine) == len(names):  # a retried launch: the machines it claimed before
            return next(m for m in mine if held[m.name].instance == request.name)
        passed: list[str] = [f"{m.name}: held by {held[m.name].run_id}" for m in machines if m.name in held]
        usable: list[Machine] = []
        refused = False
        for machine in (m for m in machines if m.name not in held):
            try:
                self.links.connection(machine)
            except (MachineDown, HostKeyRefused, AuthFailed) as exc:
                refused = refused or not isinstance(exc, MachineDown)
                passed.append(str(exc))
                continue
            usable.append(machine)
            if len(usable) == len(names):
                break
        if len(usable) < len(names):
            why = f"no {len(names)} free machine(s) of pool {section.pool} that fit: {'; '.join(passed)}"
            others = sum(1 for m in machines if m.name in held)
            if others and len(usable) + others >= len(names):  # they come free as their runs end: wait
                raise made_nothing(MachinesHeld(why))
            raise made_nothing(ProvisioningFailed(why) if refused and not others else NoCapacity(why))
        if not claims.claim(usable, names, request.run_id):  # another run was quicker: who holds what now
            held = claims.held(section.pool)
            taken = "; ".join(f"{m.name}: held by {held[m.name].run_id}" for m in machines if m.name in held)
            why = f"no {len(names)} free machine(s) of pool {section.pool} that fit: {taken}"
            raise made_nothing(MachinesHeld(why))
        return usable[0]

    def _reserved(self, pools: Pools, pool: str, name: str) -> Machine:
        """The machine claimed for a cluster's node `name` with its head."""
        found = self._claims().find([pool], name)
        machine = self._machine(pools, pool, found[1]) if found is not None else None
        if machine is None:
            raise made_nothing(ProvisioningFailed(f"no machine of pool {pool} was claimed for {name}"))
        return machine

    def _start(self, pools: Pools, section: SshSection, request: LaunchRequest, machine: Machine) -> PoolNode:
        """Start the node of `request` on `machine`: a head, or a node that joins the head's cluster."""
        ssh = self.links.connection(machine)
        join = node_ip = None
        if request.head is not None:
            head = self._find(pools, request.head)
            if head is None or head[1].node is None:
                raise made_nothing(ProvisioningFailed(f"{request.name}: its head {request.head} has no node"))
            token = self.tokens.join(request.name, request.head)
            join, node_ip = f"{address(head[0])}:{head[1].node.gcs_port}", address(machine)
        else:
            token = self.tokens.ensure(request.name)
            node_ip = address(machine) if section.num_nodes > 1 else None  # alone: loopback only
        deadline = section.terminate_after if section.terminate_after != -1 else None
        own = {
            **bootstrap.node_setup_env(request.software),
            **bootstrap.failsafe_env(deadline, request.heartbeat_timeout_s),  # the fleet gone: the node ends
            bootstrap.TOKEN_ENV: token,
        }
        env = request.node_env(section.env, own)
        try:
            return start_node(ssh, request.name, env, gpus=section.gpu_count, join=join, node_ip=node_ip)
        except MachineDown:
            self.links.drop(machine.name)
            raise

    # -- the instances --------------------------------------------------------------------------------

    def _machine(self, pools: Pools, pool: str, name: str) -> Machine | None:
        if pool not in pools.pools:
            return None
        return next((m for m in pools.machines(pool) if m.name == name), None)

    def _find(self, pools: Pools, name: str) -> tuple[Machine, Claim] | None:
        """The machine instance `name` holds, and its claim (None: it holds none, or the pools file no longer
        lists the machine: see `terminate`)."""
        if self.claims is None:
            return None
        found = self.claims.find(pools.pools, name)
        if found is None:
            return None
        pool, machine_name, claim = found
        machine = self._machine(pools, pool, machine_name)
        return (machine, claim) if machine is not None else None

    def _instance(
        self,
        machine: Machine,
        claim: Claim,
        state: NodeState = NodeState.PENDING,
        message: str = "starting",
        unanswered: Unanswered | None = None,
    ) -> NodeInstance:
        since, price = claim.since, machine.hourly_usd
        return NodeInstance(
            claim.instance, self.name, machine.name, state, since, price, message, None, unanswered
        )

    def get(self, name: str) -> NodeInstance | None:
        found = self._find(self.pools(), name)
        if found is None or found[1].node is None:
            return None  # a machine claimed for a node not started yet is no instance
        machine, claim = found
        node = claim.node
        assert node is not None
        try:
            ssh = self.links.connection(machine)
            if not alive(ssh, node):
                return self._instance(
                    machine, claim, NodeState.FAILED, f"its node ended: {log_tail(ssh, node)}"
                )
        except MachineDown as exc:
            self.links.drop(machine.name)
            down = Unanswered(Unreachable.NETWORK, str(exc), machine.name)
            return self._instance(machine, claim, message=str(exc), unanswered=down)
        except (HostKeyRefused, AuthFailed) as exc:
            return self._instance(machine, claim, NodeState.FAILED, str(exc))
        if self.tokens.head_of(name) is not None:
            return self._instance(machine, claim, NodeState.RUNNING, "running")  # its head says if it joined
        try:
            endpoint = self.endpoint(name)
        except NodeError as exc:
            return self._instance(machine, claim, message=str(exc))
        said = reach(endpoint, endpoint.headers)
        if said is None:
            return self._instance(machine, claim, NodeState.RUNNING, "ready")
        return self._instance(machine, claim, unanswered=said)

    def endpoint(self, name: str) -> NodeEndpoint:
        found = self._find(self.pools(), name)
        token = self.tokens.get(name)
        if found is None or found[1].node is None or token is None:
            raise NodeError(f"instance {name} has no Ray head on a pool machine (yet)")
        machine, claim = found
        assert claim.node is not None
        try:
            tunnel = self.links.tunnel(machine, claim.node.dashboard_port)
        except MachineDown as exc:
            self.links.drop(machine.name)
            raise NodeError(str(exc)) from None
        return NodeEndpoint(tunnel.url, tunnel.url, {"Authorization": f"Bearer {token}"})

    def endpoint_at(self, name: str, url: str | None) -> NodeEndpoint:
        """The head through this process's own tunnel: a URL found by another process is that process's."""
        return self.endpoint(name)

    def terminate(self, name: str) -> None:
        pools = self.pools()
        claims = self._claims()
        found = claims.find(pools.pools, name)
        if found is None:
            return
        pool, machine_name, claim = found
        machine = self._machine(pools, pool, machine_name)
        if machine is None:
            log.warning(
                "%s: %s held %s, which the pools file no longer lists; given back", pool, name, machine_name
            )
        elif claim.node is not None:
            try:
                ssh = self.links.connection(machine)
                if claim.node.head:
                    self.links.close_tunnel(machine.name, claim.node.dashboard_port)
                stop(ssh, claim.node)
            except (MachineDown, HostKeyRefused, AuthFailed) as exc:
                self.links.drop(machine.name)
                raise ProviderUnavailable(f"{name} not stopped, its machine kept claimed: {exc}") from None
        claims.release(pool, name)

    def gone(self, name: str, fresh: bool = False) -> bool:
        if self.claims is None:
            return True
        return self.claims.find(self.pools().pools, name) is None

    def forget(self, name: str) -> None:
        self.tokens.forget(name)

    def holdings(self) -> list[tuple[Machine, Claim | None]]:
        """Every machine of every pool, with its claim (None: free); `fleet pools`."""
        pools = self.pools()
        claims = self._claims()
        found: list[tuple[Machine, Claim | None]] = []
        for pool, machines in pools.pools.items():
            held = claims.held(pool)
            found += [(machine, held.get(machine.name)) for machine in machines]
        return found

    def list_instances(self) -> list[NodeInstance]:
        if self.claims is None or self.pools_file is None:
            return []
        out = []
        try:
            pools = self.pools()
        except ProvisioningFailed as exc:  # its claims cannot be read as machines: try again later
            raise ProviderUnavailable(str(exc)) from None
        for pool, machines in pools.pools.items():
            held = self.claims.held(pool)
            for machine in machines:
                claim = held.get(machine.name)
                if claim is not None and claim.instance.startswith(INSTANCE_PREFIX):
                    state = NodeState.RUNNING if claim.node is not None else NodeState.PENDING
                    out.append(self._instance(machine, claim, state, "claimed"))
        return out
