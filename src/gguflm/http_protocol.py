"""uvicorn's HTTP/1.1 connection (h11), hardened for a server on an untrusted network.

- Idle connections time out before their first request too, and the oldest idle ones are
  closed when more than ``cap`` are open (so the process never reaches its file-descriptor
  limit, where accept() fails and new clients, /health included, get no answer).
- A client that half-closes its socket after sending a request (``shutdown(SHUT_WR)``)
  still gets its answer: only a fully closed or reset connection means the client left.
- A connection closed while its client is still sending a request body (a 413 for a body
  over the limit, answered from its headers) is closed gracefully, as nginx's
  ``lingering_close`` does: the answer is flushed, our side shut down for writing, and
  what the client still sends is read and thrown away, up to LINGER_BYTES or
  LINGER_SECONDS. Closing at once with unread data would make the kernel reset the
  connection, and a client still writing its body would see the reset, never the answer.
"""

from __future__ import annotations

import time
from typing import Any

HEADER_SECONDS = 30         # a connection's first request must arrive within this
PROBE_SECONDS = 1.0         # how often a client that sent EOF is checked for still being there
FIRST_PROBE_SECONDS = 0.02  # ...at first: a gone client is seen within ~0.1 s, not 2 s
LINGER_SECONDS = 5.0        # a closed connection's unread body is drained for at most this
LINGER_BYTES = 256 << 20    # ...and at most this many bytes (read and dropped, never kept)

__all__ = ["hardened_protocol"]


class _LingeringTransport:
    """The connection's transport as the request cycle sees it: ``close()`` lingers (see
    the module's docstring) when the client is still sending its request body."""

    def __init__(self, transport: Any, protocol: Any) -> None:
        self._raw, self._protocol = transport, protocol
        self._closing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def is_closing(self) -> bool:
        return self._closing or self._raw.is_closing()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if not self._protocol.body_unread() or self._raw.is_closing():
            self._raw.close()
            return
        try:
            self._raw.write_eof()  # sent once the answer is flushed
        except (OSError, RuntimeError):
            self._raw.close()
            return
        self._protocol.linger()


def hardened_protocol(cap: int) -> type:
    """The h11 protocol class for uvicorn's ``http=`` (see the module's docstring)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        lingering = False

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.transport = _LingeringTransport(transport, self)
            self.opened = time.monotonic()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)
            self.loop.call_later(HEADER_SECONDS, self._first_request_too_slow)
            if len(self.connections) >= cap:  # uvicorn answers 503 from cap on
                idle = sorted((c for c in self.connections if c is not self and (
                    c.cycle is None or c.cycle.response_complete)),
                    key=lambda c: getattr(c, "opened", 0.0))
                for c in idle[:len(self.connections) - cap + 1]:
                    c.timeout_keep_alive_handler()

        def body_unread(self) -> bool:
            """Whether the client is still sending a request body we have not read."""
            return self.conn.their_state is h11.SEND_BODY

        def linger(self) -> None:
            self.lingering, self.drained = True, 0
            self.transport._raw.resume_reading()
            self.loop.call_later(LINGER_SECONDS, self.transport._raw.close)

        def data_received(self, data: bytes) -> None:
            if not self.lingering:
                super().data_received(data)
                return
            self.drained += len(data)
            if self.drained > LINGER_BYTES:
                self.transport._raw.close()

        def _first_request_too_slow(self) -> None:
            if self.cycle is None:  # no complete request head yet: a slow or silent client
                self.timeout_keep_alive_handler()

        def eof_received(self) -> bool:  # type: ignore[override]
            if self.lingering:  # the client has sent all it will: done
                return False
            # half-closed (shutdown(SHUT_WR)) or closed? Only a write tells: keep the socket
            # open to send the answer, and probe it meanwhile (see _probe)
            self.loop.call_later(FIRST_PROBE_SECONDS, self._probe, FIRST_PROBE_SECONDS)
            return True

        def _probe(self, delay: float) -> None:
            """While the answer to a client that sent EOF is not started, send it an
            interim ``100 Continue`` every second (HTTP/1.1 clients must accept 1xx answers
            before the final one). A half-closed client reads past them; a gone one resets
            the connection, uvicorn marks the request disconnected, and its work is
            cancelled at once instead of running to its end in the queue or a slot. The
            reset is only seen by the write after the one it answers, so the first probes
            come fast (``delay`` doubles from FIRST_PROBE_SECONDS up to PROBE_SECONDS)."""
            cycle = self.cycle
            if self.transport.is_closing() or cycle is None or cycle.response_started \
                    or cycle.response_complete or cycle.scope.get("http_version") != "1.1":
                return
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            delay = min(2 * delay, PROBE_SECONDS)
            self.loop.call_later(delay, self._probe, delay)

    return Protocol
