"""The fake Hub's CDN: where `/resolve` sends a client for a large (LFS) file, as the Hub does.

On huggingface.co a GET (or HEAD) of an LFS file's `/resolve/...` answers 302, its `Location` a signed
URL on another host (cdn-lfs.hf.co, or the Xet bridge), with the file's size and sha256 in
`X-Linked-Size` / `X-Linked-Etag`; the bytes, with Range, come from there. This fake's CDN is a second
server on its own port (another origin, so a client's cross-origin rules apply as they do there). A URL
is good only with its signature, and only until it expires; and like S3's and CloudFront's signed URLs it
refuses a request that also carries an `Authorization` header (a client that forwards the Hub token
across the redirect fails here, as it would against the real CDN, and leaks the token to it).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

from tests.fakes.hub_wire import FileBody, HubRequest, HubServer, Reply, parse_range
from tests.fakes.serving import Served

if TYPE_CHECKING:
    from tests.fakes.hub_store import RepoStore

URL_TTL_S = 3600.0
TWO_AUTHS = (
    "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query string "
    "parameter or the Authorization header should be specified"
)
Serve = Callable[[str, HubRequest, str, Callable[[], Reply]], Reply]


class HubCdn(Served):
    """The CDN server. `serve` is the Hub's own request accounting (counts, faults, the download log), so a
    fault scripted for "download" hits the request that sends the bytes."""

    def __init__(self, store: RepoStore, serve: Serve) -> None:
        self.store = store
        self.serve = serve
        self.port = 0
        self.key = secrets.token_bytes(32)

    def new_server(self) -> HubServer:
        return HubServer(self, self.port)

    def location(self, sha256: str, path: str, ttl_s: float = URL_TTL_S) -> str:
        """A signed URL for the blob `sha256` (`path`: the file's name in its repo, for the download log)."""
        expires = str(int(time.time() + ttl_s))
        name = quote(path, safe="")
        return (
            f"{self.url}/repos/{sha256}?path={name}&Expires={expires}&Signature={self._sign(sha256, expires)}"
        )

    def _sign(self, sha256: str, expires: str) -> str:
        return hmac.new(self.key, f"{sha256}:{expires}".encode(), hashlib.sha256).hexdigest()

    def dispatch(self, request: HubRequest) -> Reply:
        """GET / HEAD /repos/{sha256}?path=&Expires=&Signature=."""
        s = request.segments
        if len(s) != 2 or s[0] != "repos" or request.method not in ("GET", "HEAD"):
            return _xml(404, "NoSuchKey", "The specified key does not exist.")
        sha256, query = s[1], request.query
        expires, signature = query.get("Expires", ""), query.get("Signature", "")
        if "authorization" in request.headers:
            return _xml(400, "InvalidArgument", TWO_AUTHS)
        if not hmac.compare_digest(signature, self._sign(sha256, expires)):
            return _xml(403, "AccessDenied", "Invalid signature")
        if not expires.isdigit() or int(expires) < time.time():
            return _xml(403, "AccessDenied", "Request has expired")
        size = self.store.blobs.size(sha256)
        if size is None:
            return _xml(404, "NoSuchKey", "The specified key does not exist.")
        op = "download" if request.method == "GET" else "file_head"
        return self.serve(op, request, query.get("path", sha256), lambda: self._bytes(request, sha256, size))

    def _bytes(self, request: HubRequest, sha256: str, size: int) -> Reply:
        path = self.store.blobs.path(sha256)
        headers = {"ETag": f'"{sha256}"', "Accept-Ranges": "bytes"}
        span = parse_range(request.headers.get("range"), size) if request.method == "GET" else None
        if span is None:
            return Reply(200, headers=headers, file=FileBody(path, 0, size))
        headers["Content-Range"] = f"bytes {span[0]}-{span[1] - 1}/{size}"
        return Reply(206, headers=headers, file=FileBody(path, *span))


def _xml(status: int, code: str, message: str) -> Reply:
    """An error as S3 words it (the body is not JSON there; the fake's wire answers JSON: same fields)."""
    return Reply(status, {"Error": {"Code": code, "Message": message}}, {"X-Error-Code": code})
