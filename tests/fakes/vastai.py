"""A fake of vast.ai's REST API, good enough for vastai 1.9.1's `VastAI(api_key=, server_url=)` unmodified.

It serves offer search (`POST /api/v0/bundles/` with the library's filter operators), renting an offer
(`PUT /api/v0/asks/{offer}/`, a bid when `price` is set), the paged instance list (`GET /api/v1/instances/`),
one instance, start/stop/label, destroy and change_bid, and attaching an SSH key to an instance
(`POST /api/v0/instances/{id}/ssh/`). The key may come as a Bearer header (what the library sends) or as an
`api_key` query parameter (what older clients send).

An instance launched with SSH (a `runtype` naming ssh) shows vast.ai's SSH proxy (`ssh_host`, `ssh_port`),
and with direct SSH (`ssh_direc`) a "22/tcp" binding, beside a binding for every port it publishes (`-p`
in its env); nothing listens on them but the dashboard's and, on an instance with JupyterLab and a TLS
certificate, JupyterLab's TLS front (tests.fakes.tls).

A mutating call's body is checked against the fields vast.ai documents for it before anything is done
(tests.fakes.vastai_bodies). An instance whose image the fake does not know (tests.fakes.node_images) never
boots: it stays `loading`, the state vast.ai documents for "Docker image is downloading", and once its
pull has failed its `status_msg` (vast.ai's "human-readable detail on the current status") carries docker's
error for an image that does not exist. vast.ai neither stops nor destroys it: it bills until destroyed.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import shlex
import time
from typing import Any

from tests.fakes.base import DASHBOARD_PORT, FakeCloud, Handler, Instance, Request, Response
from tests.fakes.node_images import DEFAULT_IMAGE, ImageRegistry, PullLogin
from tests.fakes.nodes import unused_port
from tests.fakes.vastai_bodies import body_problem
from tests.fakes.vastai_search import OFFER_KEYS, OFFER_ROWS, BadFilter, check_filters, matches, sort_key

_ROUTES: list[tuple[str, str, str]] = [
    ("POST", r"/api/v0/bundles/?", "search"),
    ("PUT", r"/api/v0/asks/(?P<id>\d+)/?", "create"),
    ("GET", r"/api/v1/instances/?", "list"),
    ("GET", r"/api/v0/instances/?", "list"),
    ("PUT", r"/api/v0/instances/bid_price/(?P<id>\d+)/?", "bid"),
    ("GET", r"/api/v0/instances/(?P<id>\d+)/?", "get"),
    ("PUT", r"/api/v0/instances/(?P<id>\d+)/?", "update"),
    ("DELETE", r"/api/v0/instances/(?P<id>\d+)/?", "terminate"),
    ("POST", r"/api/v0/instances/(?P<id>\d+)/ssh/?", "attach_ssh"),
]
SSH_KEY_TYPES = ("ssh-", "ecdsa-", "sk-")
PULL_FAILS_AFTER_S = 1.0  # how long an image that does not exist takes to fail its pull


def _host_ports(published: list[str], runtype: str) -> dict[int, int]:
    """The host ports of an instance's published container ports (`-p HOST:CONTAINER`, beside the
    dashboard's, which the fake's node serves) and, with direct SSH, of its port 22: free ones, so that the
    node's TLS front can listen on JupyterLab's (tests.fakes.tls)."""
    ports = {int(p.split(":")[-1].split("/")[0]) for p in published} - {DASHBOARD_PORT}
    if "ssh_direc" in runtype.split() or "jupyter_direc" in runtype.split():
        ports.add(22)
    return {port: unused_port() for port in sorted(ports)}


def parse_env(env: Any) -> tuple[dict[str, str], list[str]]:
    """(variables, published ports) from the dict form or the docker-style "-e K=V -p 8265:8265" string."""
    if isinstance(env, str):
        words = shlex.split(env)
        pairs = list(itertools.pairwise(words))
        env = {w.split("=", 1)[0]: w.split("=", 1)[-1] for flag, w in pairs if flag == "-e" and "=" in w}
        env.update({f"-p {w}": "1" for flag, w in pairs if flag == "-p"})
    variables = {str(k): str(v) for k, v in dict(env or {}).items() if not str(k).startswith("-")}
    ports = [str(k)[3:] for k in dict(env or {}) if str(k).startswith("-p ")]
    return variables, ports


def _checked_body(op: str, request: Request) -> tuple[dict[str, Any], str | None]:
    """The request's body (none: {}) and why vast.ai would refuse it for the call `op` (None: it would
    not): not a JSON object, or not what the call takes (tests.fakes.vastai_bodies)."""
    try:
        body = request.json() if request.body else {}
    except ValueError:
        return {}, "the request body is not JSON"
    if not isinstance(body, dict):
        return {}, f"the request body must be a JSON object, not {type(body).__name__}"
    return body, body_problem(op, body)


def _json_object(request: Request) -> dict[str, Any]:
    """The request's body when it is a JSON object, else {} (the handler refuses it, naming why)."""
    try:
        body = request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


class FakeVastAI(FakeCloud):
    """vast.ai's REST API with a catalog of 8 offers; instance ids are integers."""

    vendor = "vastai"
    stop_notice_s = 0.0  # vast.ai documents no notice: an outbid instance is stopped at once

    def __init__(self, api_key: str = "test-key", page_size: int = 25, **kwargs: Any) -> None:
        """`page_size`: the most instances one list request gets (a larger `limit` gets that many)."""
        super().__init__(api_key, **kwargs)
        self.page_size = page_size
        self.offers: dict[int, dict[str, Any]] = {}
        for row in OFFER_ROWS:
            offer: dict[str, Any] = dict(zip(OFFER_KEYS, row, strict=True))
            offer.update(rentable=True, rented=False, external=False, machine_id=int(row[0]) + 5000)
            self.offers[int(row[0])] = offer
        self._ids = itertools.count(24_000_001)
        self.images = ImageRegistry()  # what an instance may run (tests.fakes.node_images); any other fails

    def register_image(self, name: str, like: str = DEFAULT_IMAGE) -> None:
        """Let instances run the image `name` (its nodes the environment of the known image `like`)."""
        self.images.register(name, like)

    def vendor_control(self, request: Request) -> Response | None:
        """`POST /_fake/images {"name": ..., "like": ...}`: `register_image`, for a fake served on its own."""
        if request.path == "/_fake/images" and request.method == "POST":
            return Response(*self.images.register_from(request.json()))
        return None

    # -- HTTP --------------------------------------------------------------------------------------
    def authorized(self, request: Request) -> bool:
        """Bearer header (what vastai 1.9.1 sends) or `api_key` query parameter; or, for calls on one
        instance, that instance's own key (CONTAINER_API_KEY inside it)."""
        if self.api_key in (self.bearer(request), request.query.get("api_key")):
            return True
        match = re.fullmatch(r"/api/v0/instances/(?P<id>\d+)/?", request.path)
        with self.lock:
            inst = self.instances.get(match.group("id")) if match else None
            own = inst.extra.get("container_api_key") if inst is not None else None
        return own is not None and self.bearer(request) == own

    def node_image(self, inst: Instance) -> str | None:
        """The image whose environment the instance's node runs (one with an image no one knows never
        boots)."""
        return self.images.runs_as(inst.extra.get("image"))

    def node_ports(self, inst: Instance) -> dict[int, int]:
        return dict(inst.extra.get("host_ports", {}))

    def container_env(self, instance_id: str) -> dict[str, str]:
        """What vast.ai puts in an instance's environment about itself: its id and its own API key."""
        with self.lock:
            inst = self.instances[instance_id]
            return {"CONTAINER_ID": inst.id, "CONTAINER_API_KEY": str(inst.extra["container_api_key"])}

    def unauthorized(self) -> Response:
        """vast.ai's answer to a bad key."""
        return Response(401, {"success": False, "error": "auth_error", "msg": "Invalid user key"})

    def error_body(self, status: int, message: str) -> Any:
        """vast.ai's error envelope (a 429 that is not a search quota, so clients may retry it)."""
        error = "rate_limited" if status == 429 else "server_error"
        return {"success": False, "error": error, "msg": message}

    def no_capacity(self) -> Response:
        """vast.ai's answer to a create on an ask that is gone (someone else rented it)."""
        return Response(
            400, {"success": False, "error": "no_such_ask", "msg": "Instance type no longer available."}
        )

    def quota_body(self) -> Any:
        """What vast.ai says when the account's offer searches are spent (the library does not retry)."""
        return {"success": False, "error": "search_quota_exceeded", "msg": "Search quota exceeded, slow down"}

    def not_found(self, op: str) -> Response:
        """Unknown instance: `show_instance` gets `{"instances": null}`, the rest a 404."""
        if op == "get":
            return Response(200, {"instances": None})
        return Response(404, {"success": False, "error": "no_such_instance", "msg": "Instance not found."})

    def route(self, request: Request) -> tuple[str, Handler]:
        """Match the path; `update` becomes stop/resume/label by its body."""
        for method, pattern, op in _ROUTES:
            match = re.fullmatch(pattern, request.path)
            if match is None or method != request.method:
                continue
            ident = int(match.group("id")) if "id" in match.groupdict() else 0
            if op == "update":  # by its body: a state (stop, resume: a wrong one is refused) or a label
                body = _json_object(request)
                op = "label" if "state" not in body else "resume" if body["state"] == "running" else "stop"
            return op, lambda req, op=op, ident=ident: self._handle(op, ident, req)
        return "other", lambda _r: Response(404, {"success": False, "error": "not_found", "msg": "No route"})

    def terminate_but_list(self, request: Request, listings: int) -> Response:
        """Destroy for real but keep listing the instance as running for `listings` list/get calls."""
        with self.lock:
            inst = self.instances.get(request.path.rstrip("/").rsplit("/", 1)[-1])
            if inst is not None:
                self.terminate(inst, keep_listed=listings)
                self._free_offer(inst)
        return Response(200, {"success": True})

    # -- handlers ----------------------------------------------------------------------------------
    def _handle(self, op: str, ident: int, request: Request) -> Response:
        body, problem = _checked_body(op, request)
        if problem is not None:  # refused before anything is done, as vast.ai refuses it
            return Response(400, {"success": False, "error": "invalid_args", "msg": problem})
        with self.lock:
            if op == "search":
                return self._search(body)
            if op == "create":
                return self._create(ident, body)
            if op == "list":
                return self._list(request.query)
            if op == "get":
                inst = self.instances.get(str(ident))
                shown = self.visible(inst) if inst is not None else None
                row = self._render(inst, shown) if inst is not None and shown is not None else None
                return Response(200, {"instances": row})
            inst = self.instances.get(str(ident))
            if inst is None or inst.state == "terminated":
                return self.not_found(op)
            if op == "terminate":
                self.terminate(inst)
                self._free_offer(inst)
            elif op == "stop":
                self.set_stopped(inst)
            elif op == "resume" and inst.state in ("stopped", "preempted"):
                if inst.extra.get("pull_error"):  # its host tries the pull again, and fails again
                    inst.extra["pull_started"] = time.time()
                self.resume(inst)
            elif op == "label":
                inst.name = str(body.get("label", inst.name))
                self.note_live(inst.name)
            elif op == "attach_ssh":
                key = str(body.get("ssh_key") or "").strip()
                if not key.startswith(SSH_KEY_TYPES) or "\n" in key:
                    msg = "Invalid ssh key: expected an OpenSSH public key"
                    return Response(400, {"success": False, "error": "invalid_args", "msg": msg})
                inst.extra.setdefault("ssh_keys", []).append(key)
                return Response(200, {"success": True, "msg": "SSH key attached to the instance"})
            elif op == "bid":
                price = float(body.get("price") or 0)
                inst.bid = round(price / inst.gpu_count, 6)
                inst.price_per_hour = price
            return Response(200, {"success": True})

    def _search(self, query: dict[str, Any]) -> Response:
        bid = query.get("type") == "bid"
        rows = []
        try:
            check_filters(query)
            for offer in self.offers.values():
                row = dict(offer, dph_total=offer["min_bid"] if bid else offer["dph_total"], is_bid=bid)
                if matches(row, query):
                    rows.append(row)
        except BadFilter as exc:
            return Response(400, {"success": False, "error": "invalid_args", "msg": str(exc)})
        for key, direction in reversed(query.get("order") or []):
            rows.sort(key=lambda r: sort_key(r, str(key)), reverse=direction == "desc")
        limit = int(query.get("limit") or 64)
        return Response(200, {"offers": rows[:limit]})

    def _create(self, offer_id: int, body: dict[str, Any]) -> Response:
        offer = self.offers.get(offer_id)
        if offer is None or not offer["rentable"]:
            msg = "Instance type no longer available."
            return Response(400, {"success": False, "error": "no_such_ask", "msg": msg})
        price = body.get("price")
        if price is not None and float(price) < offer["min_bid"]:
            msg = f"Your bid price must be at least {offer['min_bid']}"
            return Response(400, {"success": False, "error": "invalid_args", "msg": msg})
        env, ports = parse_env(body.get("env"))
        runtype = str(body.get("runtype") or "")  # checked with the body (tests.fakes.vastai_bodies)
        count = int(offer["num_gpus"])
        # an image no one has, or a private one without its login (docker login on the host): it never boots
        pull_error = self.images.pull_error(body.get("image"), _login(body.get("image_login")))
        inst = Instance(
            id=str(next(self._ids)),
            name=str(body.get("label") or ""),
            gpu=str(offer["gpu_name"]),
            gpu_count=count,
            price_per_hour=float(price) if price is not None else float(offer["dph_total"]),
            bid=round(float(price) / count, 6) if price is not None else None,
            env=env,
            extra={
                "offer": offer_id,
                "image": body.get("image"),
                "disk": body.get("disk"),
                "onstart": body.get("onstart"),
                "ports": ports,
                "runtype": runtype,
                "host_ports": _host_ports(ports, runtype),
                "container_api_key": secrets.token_hex(16),
                **({"pull_error": pull_error, "pull_started": time.time()} if pull_error else {}),
            },
        )
        inst.stuck = pull_error is not None
        offer.update(rentable=False, rented=True)
        self.add_instance(inst)
        return Response(200, {"success": True, "new_contract": int(inst.id)})

    def _free_offer(self, inst: Instance) -> None:
        offer = self.offers.get(int(inst.extra.get("offer", 0)))
        if offer is not None:
            offer.update(rentable=True, rented=False)

    def _list(self, query: dict[str, str]) -> Response:
        filters = json.loads(query.get("select_filters") or "{}")
        asked = int(json.loads(query.get("limit") or str(self.page_size)))
        limit = min(asked, self.page_size)  # page_size: the server's own cap
        start = int(query.get("after_token") or 0)
        rows = []
        for inst in sorted(self.instances.values(), key=lambda i: int(i.id)):
            shown = self.visible(inst)
            if shown is not None:
                row = self._render(inst, shown)
                if matches(row, filters):
                    rows.append(row)
        page = rows[start : start + limit]
        next_token = str(start + limit) if start + limit < len(rows) else None
        return Response(200, {"instances": page, "next_token": next_token, "total_instances": len(rows)})

    def _render(self, inst: Instance, shown: str) -> dict[str, Any]:
        """The instance in vast.ai's wire shape, for the state a caller sees."""
        offer = self.offers.get(int(inst.extra.get("offer", 0)), {})
        running = shown == "running"
        actual = {
            "starting": None if time.time() - inst.created_at < 0.05 else "loading",
            "running": "running",
            "stopped": "exited",
            "preempted": "stopped",
        }.get(shown)
        ports = {}
        if running:
            host = [{"HostIp": "127.0.0.1", "HostPort": str(inst.public_port)}]
            ports = {f"{DASHBOARD_PORT}/tcp": host}
            for port, host_port in inst.extra.get("host_ports", {}).items():  # see the module docstring
                ports[f"{port}/tcp"] = [{"HostIp": "0.0.0.0", "HostPort": str(host_port)}]
        status_msg = "outbid by a higher bid" if shown == "preempted" else f"{actual or 'creating'}"
        pulling = inst.extra.get("pull_error") if shown == "starting" else None
        if pulling and time.time() - inst.extra["pull_started"] >= PULL_FAILS_AFTER_S:
            status_msg = pulling  # still `loading`: see the module docstring
        runtype = str(inst.extra.get("runtype") or "")
        ssh: dict[str, Any] = {}
        if "ssh" in runtype or "jupyter" in runtype:  # launched with SSH: vast.ai's proxy for it
            number = int(inst.id)
            ssh = {"ssh_host": f"ssh{number % 9 + 1}.vast.ai", "ssh_port": 20_000 + number % 10_000}
        return {
            **ssh,
            "image_runtype": runtype or None,
            "id": int(inst.id),
            "label": inst.name or None,
            "actual_status": actual,
            "intended_status": "stopped" if shown == "stopped" else "running",
            "cur_state": "running" if shown in ("starting", "running") else "stopped",
            "status_msg": status_msg,
            "dph_total": inst.price_per_hour,
            "is_bid": inst.interruptible,
            "min_bid": offer.get("min_bid"),
            "gpu_name": inst.gpu,
            "num_gpus": inst.gpu_count,
            "gpu_util": inst.gpu_util if running else None,
            "gpu_ram": offer.get("gpu_ram"),
            "uptime_mins": round(inst.uptime_s() / 60, 2),
            "start_date": inst.created_at,
            "public_ipaddr": "127.0.0.1",
            "ports": ports,
            "image_uuid": inst.extra.get("image"),
            "disk_space": inst.extra.get("disk"),
            "machine_id": offer.get("machine_id"),
            "extra_env": [[k, v] for k, v in inst.env.items()],
            "onstart": inst.extra.get("onstart"),
        }


def _login(arguments: object) -> PullLogin | None:
    """The docker login a create's `image_login` gives the host (`-u USER -p TOKEN [SERVER]`, Docker Hub
    when no server is named), or None: none, or arguments docker login would refuse (so no login)."""
    if not isinstance(arguments, str) or not arguments.strip():
        return None
    words, found = shlex.split(arguments), {}
    while len(words) >= 2 and words[0] in ("-u", "-p", "--username", "--password"):
        found[words[0].lstrip("-")[0]] = words[1]
        words = words[2:]
    if set(found) != {"u", "p"} or len(words) > 1:
        return None
    return PullLogin(words[0].lower() if words else "docker.io", found["u"], found["p"])
