"""Who may talk to a trainbus server: one ASGI middleware for the service and the dashboard.

It lives in ``trainbus.callbacks``, beside the dashboard's page server (``_dashboard_page``),
so that the ``Dashboard`` callback and ``trainbus.serve`` (a layer above) share it.

Both servers start and stop training or show a run's data, and a web page the user visits
must reach neither. :class:`Guard` wraps the application and checks each request, in order:

1. **Host.** The ``Host`` header must name this server: ``localhost``, ``127.0.0.1`` or
   ``[::1]``, the address the connection arrived on, or a host in ``allowed_hosts``
   (``"*"``: any). A page that makes its own domain resolve to 127.0.0.1 (DNS rebinding)
   sends its domain as ``Host`` and is refused (403), for every route: the job list, the
   SSE streams and the dashboard page included.
2. **Token**, when the server has one: ``Authorization: Bearer <token>``, ``?token=<token>``
   (which also sets an ``HttpOnly``, ``SameSite=Strict`` cookie, so a browser's page,
   scripts and event stream follow), or that cookie; otherwise 401. Without a token, a
   request that arrived on an address other than loopback is refused (403) unless the
   server was started with ``insecure_no_token=True``.
3. **Writes.** A request that is not ``GET``/``HEAD``/``OPTIONS`` must carry no ``Origin``
   or this server's own (403), and a ``POST``/``PUT``/``PATCH`` must be
   ``Content-Type: application/json`` (415): a page on another site can send a
   ``text/plain`` or form POST without asking first, but not a JSON one, and this server
   answers no CORS preflight.

:func:`access_options` validates the options once, for ``create_app`` and ``Dashboard``;
:func:`check_bind` refuses a non-loopback address without a token.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["LOOPBACK_NAMES", "Access", "Guard", "access_options", "check_bind", "is_loopback"]

#: Host names that always mean this machine.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_TOKEN = re.compile(r"[A-Za-z0-9._~-]{16,}")
_DEFAULT_PORT = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True, slots=True)
class Access:
    """Who a server answers (see the module docstring).

    Attributes:
        token: Required on every request when set.
        allowed_hosts: ``Host`` names accepted besides loopback and the connection's own
            address (lower case, without brackets or port); ``"*"`` accepts any.
        insecure_no_token: Answer requests from other machines without a token.
        server: Which server it guards, for the fixes its refusals name: ``"service"``
            (``trainbus serve``, ``create_app``) or ``"dashboard"`` (``Dashboard``).
    """

    token: str | None = None
    allowed_hosts: frozenset[str] = frozenset()
    insecure_no_token: bool = False
    server: Literal["service", "dashboard"] = "service"

    @property
    def _options(self) -> dict[str, str]:
        """How a user sets each option of this server, for the messages."""
        if self.server == "dashboard":
            return {"hosts": "Dashboard(allowed_hosts=[...])", "token": "Dashboard(token=...)",
                    "writes": "this dashboard's server"}  # fmt: skip
        return {
            "hosts": "create_app(allowed_hosts=[...]) (trainbus serve --allow-host NAME)",
            "token": "trainbus serve --token, create_app(token=...)",
            "writes": "this server's jobs",
        }


def _bare(host: str) -> str:
    """``host`` in lower case, without the brackets of an IPv6 literal."""
    host = host.strip().lower()
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address to bind) means this machine only.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
        (True, True, False)
        >>> is_loopback("::ffff:127.0.0.1")
        True
    """
    host = _bare(host)
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, on a socket bound to ::
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def access_options(
    token: str | None,
    allowed_hosts: Iterable[str],
    insecure_no_token: bool,
    server: Literal["service", "dashboard"] = "service",
) -> Access:
    """Validate a server's access options (``create_app`` and ``Dashboard`` alike)."""
    if token is not None and (not isinstance(token, str) or not _TOKEN.fullmatch(token)):
        raise ValueError(
            "token=... must be at least 16 characters of letters, digits and ._~- "
            "(e.g. secrets.token_urlsafe(32)), or None for no token"
        )
    if isinstance(allowed_hosts, str):
        raise TypeError(
            f"allowed_hosts={allowed_hosts!r} must be a list of host names, e.g. "
            f"[{allowed_hosts!r}]"
        )
    hosts = set()
    for host in allowed_hosts:
        bare = _bare(host) if isinstance(host, str) else ""
        if not bare or "/" in bare or (":" in bare and not _is_ip(bare)):
            raise ValueError(
                f"allowed_hosts entry {host!r} must be a host name or address without "
                "scheme or port, e.g. 'trainer.example.com' or '10.0.0.5' ('*': any host)"
            )
        hosts.add(bare)
    return Access(token, frozenset(hosts), bool(insecure_no_token), server)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_bind(host: str, access: Access, how: str) -> None:
    """Refuse to listen on ``host`` beyond loopback without a token (unless insecure).

    ``how`` names the call that sets a token, for the message.
    """
    if is_loopback(host) or access.token is not None or access.insecure_no_token:
        return
    raise ValueError(
        f"listening on {host!r} (not loopback) lets other machines start and read jobs: "
        f"set a token ({how}), or pass insecure_no_token=True to serve them without one"
    )


def _host_name(header: str) -> str | None:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), or None."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        rest = header[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return header[1:end]
    name, _, port = header.partition(":")
    if not name or (port and not port.isdigit()) or ":" in port:
        return None
    return name


def _origin_matches(origin: str, host_header: str, scheme: str) -> bool:
    """Whether ``Origin`` names the server the request was sent to (its ``Host``)."""
    try:
        parts = urlsplit(origin)
        origin_port = parts.port or _DEFAULT_PORT.get(parts.scheme)
        sent = urlsplit(f"{scheme}://{host_header.strip()}")
        sent_port = sent.port or _DEFAULT_PORT.get(scheme)
    except ValueError:
        return False
    return bool(parts.hostname) and (parts.hostname, origin_port) == (sent.hostname, sent_port)


class Guard:
    """ASGI middleware: the Host check, the token and same-origin JSON writes.

    Example:
        >>> app = Starlette(routes=..., middleware=[Middleware(Guard, access=Access())])
    """

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refused, cookie = self._check(scope, headers)
        if refused is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await refused(scope, receive, send)
            return
        if cookie is None:
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), cookie]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    def _check(
        self, scope: Scope, headers: dict[str, str]
    ) -> tuple[JSONResponse | None, tuple[bytes, bytes] | None]:
        access = self.access
        server = scope.get("server") or (None, None)
        local = _bare(str(server[0])) if server[0] is not None else None
        host_header = headers.get("host", "")
        name = _host_name(host_header)
        if name is None or not (
            name in LOOPBACK_NAMES
            or name == local
            or name in access.allowed_hosts
            or "*" in access.allowed_hosts
        ):
            return _refuse(
                403,
                f"Host {host_header!r} is not this server's name; it answers to localhost, "
                "127.0.0.1, [::1] and the address it listens on (a page whose domain "
                "resolves here is refused: DNS rebinding). To serve under another name, "
                f"list it: {access._options['hosts']}",
            ), None
        cookie = None
        if access.token is not None:
            given, from_query = _credentials(scope, headers, _cookie_name(server[1]))
            if given is None or not hmac.compare_digest(given, access.token):
                return _refuse(
                    401,
                    "this server needs its token: open the URL it printed (ending in "
                    "?token=...), or send the header Authorization: Bearer <token>",
                    {"WWW-Authenticate": "Bearer"},
                ), None
            if from_query:
                cookie = _set_cookie(_cookie_name(server[1]), access.token)
        elif local is not None and _is_ip(local) and not is_loopback(local) and not (
            access.insecure_no_token
        ):
            return _refuse(
                403,
                f"this server has no token, so it answers only on loopback (this request came "
                f"in on {local}); set a token ({access._options['token']}) or pass "
                "insecure_no_token=True",
            ), None
        method = scope.get("method", "GET")
        if method in _SAFE_METHODS or scope["type"] == "websocket":
            return None, cookie
        origin = headers.get("origin")
        if origin is not None and not _origin_matches(origin, host_header, scope["scheme"]):
            return _refuse(
                403,
                f"{method} from another site refused (Origin {origin!r}); a page on another "
                f"site cannot change {access._options['writes']}; send it from this server's "
                "own page or from a client without an Origin header (curl, httpx)",
            ), None
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if method in _BODY_METHODS and media != "application/json":
            return _refuse(
                415,
                f"{method} takes a JSON body: send Content-Type: application/json (got "
                f"{media or 'none'!r}; curl: --json '{{...}}', httpx: json={{...}})",
            ), None
        return None, cookie


def _refuse(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _cookie_name(port: Any) -> str:
    """One cookie per port: browsers share a host's cookies across its ports."""
    return f"trainbus-token-{port}" if isinstance(port, int) else "trainbus-token"


def _credentials(
    scope: Scope, headers: dict[str, str], cookie_name: str
) -> tuple[str | None, bool]:
    """The token the request carries and whether it came as ``?token=``."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), False
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if query.get("token"):
        return query["token"][-1], True
    jar = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header: no token from it
        return None, False
    morsel = jar.get(cookie_name)
    return (morsel.value if morsel is not None else None), False


def _set_cookie(name: str, token: str) -> tuple[bytes, bytes]:
    value = f"{name}={token}; Path=/; HttpOnly; SameSite=Strict"
    return b"set-cookie", value.encode("latin-1")
