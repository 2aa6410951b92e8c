"""The chat page that ``gguflm serve`` answers at ``GET /``: three static files kept as
package data (no build step, no CDN, nothing fetched at run time), served as they are.

The page talks only to the server's own ``/v1/models``, ``/v1/chat/completions`` (streamed)
and ``/health``. Any HTTP server serves it the same way: for each path in ``ROUTES``, answer
``GET`` with ``asset(name)``, ``CONTENT_TYPES[name]`` and ``HEADERS``. The Content Security
Policy in ``HEADERS`` lets the page run only its own script and connect only to its own
origin: a second wall behind the page's renderer, which never turns model output into HTML.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["CONTENT_TYPES", "HEADERS", "ROUTES", "asset"]

# URL path -> file name; the assets live under /webui/ so they cannot shadow an API path
ROUTES = {"/": "index.html", "/webui/app.js": "app.js", "/webui/style.css": "style.css"}

CONTENT_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-cache"),  # revalidate, so an upgraded gguflm serves its new page
)


@cache
def asset(name: str) -> bytes:
    """The bytes of one of the page's files (a name in ``CONTENT_TYPES``; KeyError for any
    other name, so a request path can never reach another file)."""
    if name not in CONTENT_TYPES:
        raise KeyError(f"no such web page file: {name!r}")
    return resources.files(__package__).joinpath(name).read_bytes()
