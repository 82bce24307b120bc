"""Why a call to a node's Ray head got no answer, told from the call's error (providers.node.reach).

The cause (core.errors.Unreachable) decides what provision does: a certificate the fleet's check refuses
(no trusted authority signed it, it names another host, it is not the one pinned for the node) does not
heal by waiting, so the run fails soon, naming it; a refused or closed connection, a timeout or a proxy's
502 is what a booting node gives, so the run waits on, and says why if it waits in vain. requests wraps
the error it met in urllib3's (MaxRetryError, with its `reason`), which wraps the ssl module's or the
socket's: the chain is read from the outside in, and the innermost error's words are the detail.
"""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Iterator

import requests
import urllib3.exceptions

from core.errors import Unreachable
from providers.base import Unanswered

HOSTNAME_MISMATCH = frozenset({62, 64})  # OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH, _IP_ADDRESS_MISMATCH
PIN_MISMATCH = "Fingerprints did not match"  # urllib3's words for a pinned certificate that differs
DETAIL_MAX = 300
CLOSED = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, http.client.RemoteDisconnected)
TIMEOUTS = (requests.Timeout, TimeoutError, urllib3.exceptions.TimeoutError)


def chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what it wraps (its cause or context, urllib3's `reason`, an error among its args),
    outermost first."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        inner = [current.__cause__, current.__context__, getattr(current, "reason", None), *current.args]
        current = next((e for e in inner if isinstance(e, BaseException)), None)


def unanswered(error: BaseException, endpoint: str, pinned: bool) -> Unanswered:
    """What the call to `endpoint` met (`pinned`: the node's own certificate is the only one trusted)."""
    errors = list(chain(error))
    cause, detail = _cause(errors, pinned)
    return Unanswered(cause, detail[:DETAIL_MAX], endpoint)


def _cause(errors: list[BaseException], pinned: bool) -> tuple[Unreachable, str]:
    innermost = str(errors[-1]) or type(errors[-1]).__name__
    for found in errors:
        if isinstance(found, ssl.SSLCertVerificationError):
            said = f"certificate verify failed: {found.verify_message}"
            if found.verify_code in HOSTNAME_MISMATCH:
                return Unreachable.HOSTNAME, said
            if pinned:  # only the pinned certificate is trusted: any other fails verification
                return Unreachable.PIN, f"{said} (not the certificate pinned for the node)"
            return Unreachable.CERTIFICATE, said
    if any(PIN_MISMATCH in str(found) for found in errors):
        return Unreachable.PIN, innermost
    checks: tuple[tuple[Unreachable, type[BaseException] | tuple[type[BaseException], ...]], ...] = (
        (Unreachable.TLS, ssl.SSLError),
        (Unreachable.REFUSED, ConnectionRefusedError),
        (Unreachable.CLOSED, CLOSED),
    )
    for cause, kinds in checks:
        if any(isinstance(found, kinds) for found in errors):
            return cause, innermost
    if any(isinstance(found, TIMEOUTS) for found in errors):  # after REFUSED: urllib3's NewConnectionError
        return Unreachable.TIMEOUT, innermost  # is a ConnectTimeoutError
    return Unreachable.NETWORK, innermost
