"""Who may use the server: browser origins (CORS) and the optional API key.

Framework-free so that any HTTP server can apply it: it reads the request's method, path and
headers and says what to answer. The rules:

- **Origins.** A request without an ``Origin`` header (curl, the ``openai`` client) or from
  the server's own origin (the ``Origin``'s host:port equals the ``Host`` header, as for the
  chat page) is answered. A request from another origin is answered only when that origin was
  allowed (``--cors ORIGIN``, ``*`` for any); otherwise it gets 403 with an OpenAI error
  object (``code: "origin_not_allowed"``), so another web site cannot even make the model
  work for it (browsers send ``Origin`` on every cross-origin fetch and every POST). Answers to
  allowed cross-origin requests carry ``Access-Control-Allow-Origin`` and ``Vary: Origin``;
  their preflight (``OPTIONS`` with ``Access-Control-Request-Method``) gets 204 with the
  allowed methods and the requested headers.
- **Hosts.** A request's ``Host`` header must name this server: an IP address (a browser
  that connected to an address sends that address), ``localhost`` (or a name under
  ``.localhost``), the name the server was bound to (``--host``), or one of the names it was
  told it serves (``--allowed-host NAME``, ``*`` for any). Anything else gets 403
  (``code: "host_not_allowed"``): that is what a page does after DNS rebinding (its own
  name, made to point at 127.0.0.1, so that its requests count as same-origin).
- **API key.** With a key, every API path (not ``/health``, not the page and its assets)
  needs ``Authorization: Bearer KEY``, as OpenAI clients send it; a missing or wrong key gets
  401 with an OpenAI error object (``code: "invalid_api_key"``) and ``WWW-Authenticate:
  Bearer``. Preflights carry no credentials, so they are answered without the key.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["AccessPolicy", "check_host", "check_origin"]

# Paths answered without the API key: the liveness probe (load balancers and the page poll it)
# and the page itself, which holds nothing secret and asks the person for the key.
PUBLIC_PATHS = frozenset({"/health"})
ALLOWED_METHODS = "GET, POST, OPTIONS"
_HEADER_LIST = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~, -]*$")  # tokens and separators only


def check_origin(value: str) -> str:
    """``value`` as an allowed origin (``scheme://host[:port]``, ``*`` or ``null``),
    normalized; ValueError saying what is wrong otherwise."""
    value = value.strip()
    if value in ("*", "null"):
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or \
            parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{value!r} is not an origin (scheme://host[:port], or *)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError(f"{value!r} has an invalid port") from None
    return f"{parts.scheme}://{parts.netloc}".lower()


def check_host(value: str) -> str:
    """``value`` as an allowed host name (``*``: any), lower-case; ValueError if it is not
    a host name."""
    value = value.strip().lower().rstrip(".")
    if value == "*" or _HOSTNAME.fullmatch(value) or _ip(value.strip("[]")):
        return value.strip("[]")
    raise ValueError(f"{value!r} is not a host name")


_HOSTNAME = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*")


def _ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _host_name(host: str) -> str:
    """The name in a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower-case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    return name.rstrip(".")


def _same_origin(origin: str, host: str | None) -> bool:
    """The page's own requests: the origin's host:port is the Host the browser asked for.
    The scheme is not compared, so a TLS proxy in front that keeps the Host header works."""
    if not host:
        return False
    netloc = urlsplit(origin).netloc.lower()
    return bool(netloc) and netloc == host.strip().lower()


class AccessPolicy:
    """The origin and API-key rules for one server (see the module docstring)."""

    def __init__(self, cors: Iterable[str] = (), api_key: str | None = None,
                 hosts: Iterable[str] = ()) -> None:
        self.hosts = frozenset(check_host(h) for h in hosts if h.strip())
        self.origins = frozenset(check_origin(o) for o in cors)
        self.any_origin = "*" in self.origins
        if api_key is not None and not api_key:
            raise ValueError("the API key must not be empty")
        self.api_key = api_key

    # --- hosts ---------------------------------------------------------------------------------

    def host_error(self, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """The 403 body when the ``Host`` header names a host this server was not told it
        serves (DNS rebinding), else None."""
        host = headers.get("Host")
        if host is None or "*" in self.hosts:
            return None
        name = _host_name(host)
        if _ip(name) or name == "localhost" or name.endswith(".localhost") \
                or name in self.hosts:
            return None
        return _error(f"requests for the host {name[:100]!r} are not allowed (start the "
                      "server with --allowed-host NAME to serve that name)",
                      "host_not_allowed")

    # --- origins -------------------------------------------------------------------------------

    def cross_origin(self, headers: Mapping[str, str]) -> str | None:
        """The request's ``Origin`` when it is another origin than the server's, else None."""
        origin = headers.get("Origin")
        if origin is None or _same_origin(origin, headers.get("Host")):
            return None
        return origin

    def origin_error(self, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """The 403 body when the request comes from an origin not allowed, else None."""
        origin = self.cross_origin(headers)
        if origin is None or self.any_origin or origin.strip().lower() in self.origins:
            return None
        return _error(f"requests from the origin {origin[:100]!r} are not allowed (start "
                      "the server with --cors ORIGIN to allow them)", "origin_not_allowed")

    def cors_headers(self, headers: Mapping[str, str]) -> list[tuple[str, str]]:
        """Headers for the answer to an allowed cross-origin request (none otherwise)."""
        origin = self.cross_origin(headers)
        if origin is None or self.origin_error(headers) is not None:
            return []
        if self.any_origin:
            return [("Access-Control-Allow-Origin", "*")]
        return [("Access-Control-Allow-Origin", origin), ("Vary", "Origin")]

    def preflight_headers(self, headers: Mapping[str, str]) -> list[tuple[str, str]]:
        """Headers for the 204 answer to an ``OPTIONS`` request, besides ``cors_headers``
        (which every answer carries); call after ``origin_error`` said it may be answered."""
        out = [("Allow", ALLOWED_METHODS)]
        if self.cors_headers(headers) and headers.get("Access-Control-Request-Method"):
            out += [("Access-Control-Allow-Methods", ALLOWED_METHODS),
                    ("Access-Control-Max-Age", "600")]
            wanted = headers.get("Access-Control-Request-Headers", "")
            if wanted and _HEADER_LIST.match(wanted):
                out.append(("Access-Control-Allow-Headers", wanted))
        return out

    # --- the API key ---------------------------------------------------------------------------

    def key_error(self, path: str, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """The 401 body when ``path`` needs the key and the request lacks it, else None."""
        if self.api_key is None or path in PUBLIC_PATHS:
            return None
        scheme, _, token = headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer":
            token = ""
        token = token.strip() or headers.get("x-api-key", "").strip()  # Anthropic's header
        if token and hmac.compare_digest(token.encode("utf-8", "replace"),
                                         self.api_key.encode("utf-8")):
            return None
        what = "wrong" if token else "missing"
        return _error(f"the API key is {what}: send it as 'Authorization: Bearer KEY' (or "
                      "'x-api-key: KEY')", "invalid_api_key")


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": code}}
