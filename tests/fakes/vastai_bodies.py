"""The bodies of vast.ai's mutating calls, as the vast.ai fake checks them before it acts on any.

vast.ai documents the fields each call takes (docs.vast.ai, api-reference "create instance" and "creating
instances with api"; the same endpoint's OpenAPI file), and vastai 1.9.1 sends exactly those
(`vastai.api.instances.build_create_instance_payload`, `vastai.data.instance.InstanceConfig`). A fake that
read only the fields it knew let a misspelled one through silently: a create with `labl` made an instance
without its label, which the fleet then could not find by name. Here a body with a field its call does
not take, or a value of the wrong type, is answered 400 with vast.ai's error envelope, naming the field,
and nothing is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RUNTYPES = frozenset({"ssh", "ssh_proxy", "ssh_direc", "jupyter", "jupyter_proxy", "jupyter_direc", "args"})
TARGET_STATES = frozenset({"running", "stopped"})
_NUMBER = (int, float)


@dataclass(frozen=True)
class Body:
    """What one call's JSON body may hold: each field's JSON types (None is always allowed: the library
    sends unset fields as null), and the fields it must have."""

    fields: dict[str, tuple[type, ...]]
    required: frozenset[str] = frozenset()


CREATE = Body(
    {
        "client_id": (str,),  # "me"
        "image": (str,),  # required unless a template gives it
        "template_hash_id": (str,),
        "template_id": (int,),
        "label": (str,),
        "disk": _NUMBER,  # GB
        "runtype": (str,),  # RUNTYPES, space-separated
        "target_state": (str,),  # TARGET_STATES
        "price": _NUMBER,  # a bid, $/h for the machine: interruptible
        "env": (dict, str),  # {"K": "v", "-p 8265:8265": "1"} or the docker-style "-e K=v -p ..." string
        "onstart": (str,),
        "args": (list,),
        "args_str": (str,),
        "image_login": (str,),  # docker login arguments for a private registry
        "extra": (str,),
        "python_utf8": (bool,),
        "lang_utf8": (bool,),
        "use_jupyter_lab": (bool,),
        "jupyter_dir": (str,),
        "force": (bool,),
        "cancel_unavail": (bool,),
        "user": (str,),
        "volume_info": (dict,),
        "create_from": (str, int),  # dstack's vast.ai client sends it (null)
    }
)
BODIES = {
    "create": CREATE,
    "stop": Body({"state": (str,)}, frozenset({"state"})),  # PUT /instances/{id}/ {"state": "stopped"}
    "resume": Body({"state": (str,)}, frozenset({"state"})),
    "label": Body({"label": (str,)}, frozenset({"label"})),
    "bid": Body({"client_id": (str,), "price": _NUMBER}, frozenset({"price"})),
    "attach_ssh": Body({"ssh_key": (str,)}, frozenset({"ssh_key"})),
    "terminate": Body({}),  # vastai sends `{}`; the node's failsafe sends no body at all
}


def body_problem(op: str, body: Any) -> str | None:
    """Why vast.ai would refuse `body` for the call `op` (None: it would not, or `op` has no body to
    check): an unknown field, a value of the wrong type, a required field missing, an unknown runtype or
    target state."""
    shape = BODIES.get(op)
    if shape is None:
        return None
    if not isinstance(body, dict):
        return f"the request body must be a JSON object, not {type(body).__name__}"
    unknown = sorted(set(body) - set(shape.fields))
    if unknown:
        valid = ", ".join(sorted(shape.fields)) or "none"
        return f"unknown field(s) {', '.join(unknown)}; this call takes: {valid}"
    for name, kinds in shape.fields.items():
        value = body.get(name)
        if value is None:
            continue
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            wanted = " or ".join(_JSON_NAMES[kind] for kind in kinds)
            return f"field {name} must be {wanted}, not {type(value).__name__} {value!r}"
    missing = sorted(name for name in shape.required if body.get(name) is None)
    if missing:
        return f"missing required field(s) {', '.join(missing)}"
    return _value_problem(op, body)


_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object",
               list: "a list"}  # fmt: skip


def _value_problem(op: str, body: dict[str, Any]) -> str | None:
    """The checks on values a type does not make: a create's image (or template), runtype and initial
    state; a stop's or resume's state."""
    if op == "create":
        if not body.get("image") and not body.get("template_hash_id") and body.get("template_id") is None:
            return "image is required (or template_hash_id, whose template gives one)"
        runtype = str(body.get("runtype") or "")
        if not set(runtype.split()) <= RUNTYPES:
            return f"invalid runtype {runtype!r}; valid: {', '.join(sorted(RUNTYPES))}"
        state = body.get("target_state")
        if state is not None and state not in TARGET_STATES:
            return f"invalid target_state {state!r}; valid: running, stopped"
    if op in ("stop", "resume") and body.get("state") not in TARGET_STATES:
        return f"invalid state {body.get('state')!r}; valid: running, stopped"
    return None
