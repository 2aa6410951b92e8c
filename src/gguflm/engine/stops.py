"""Stop strings: found in streamed text, bounded in number and length.

OpenAI allows 4 stop strings; we accept up to ``MAX_STOPS`` of up to ``MAX_STOP_CHARS``
characters each, so that scanning costs at most a fixed amount per new piece of text
(a request with 10,000 stop strings would otherwise slow every token of every request).
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_STOPS = 16
MAX_STOP_CHARS = 256


class StopError(ValueError):
    """Stop strings that are not a string or a list of strings, or over the limits."""


def check_stops(stop: object) -> list[str]:
    """The stop strings of a request (None, a string or a list of strings), checked."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, Sequence) and not isinstance(stop, bytes) and all(
            isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise StopError("stop must be a string or a list of strings")
    if len(stops) > MAX_STOPS:
        raise StopError(f"at most {MAX_STOPS} stop strings are allowed, got {len(stops)}")
    for s in stops:
        if len(s) > MAX_STOP_CHARS:
            raise StopError(f"a stop string may have at most {MAX_STOP_CHARS} characters, "
                            f"got one of {len(s)}")
    return [s for s in stops if s]


class StopScanner:
    """Finds stop strings in streamed text. ``feed`` returns the text that is safe to emit
    (held back: any tail that could still grow into a stop string) and whether a stop
    string was found (text from it on is dropped, as OpenAI does). Each call costs
    O(len(text) + held) per stop string, and at most MAX_STOP_CHARS are ever held."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.hit = False
        self.matched: str | None = None  # the stop string found (the earliest in the text)

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        found = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda f: f[0])
            self.hit = True
            self._held = ""
            return buf[:cut]
        keep = 0  # the longest tail of buf that is a proper prefix of some stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        out, self._held = ("" if self.hit else self._held), ""
        return out
