"""The server's counters and latency histograms, and ``/metrics`` in Prometheus' text format.

``METRICS`` is the table of what the engine counts (name, type, help, how to read it);
``ServerMetrics`` adds the server's own counts (requests, errors, disconnects, 503s) and the
time-to-first-token and duration histograms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["BUCKETS", "METRICS", "ServerMetrics"]

# latency histogram buckets (seconds)
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_Read = Callable[[Any, Any, float], Any]  # (engine, engine.stats, uptime) -> value
METRICS: tuple[tuple[str, str, str, _Read], ...] = (
    ("requests_total", "counter", "Requests accepted by the engine.",
     lambda e, st, up: st.requests),
    ("requests_finished_total", "counter", "Requests ended, by finish reason.",
     lambda e, st, up: {f'reason="{k}"': v for k, v in sorted(st.finished.items())}),
    ("requests_rejected_total", "counter", "Requests refused with 503 (queue full).",
     lambda e, st, up: st.rejected),
    ("prompt_tokens_total", "counter", "Prompt tokens evaluated.",
     lambda e, st, up: st.prompt_tokens),
    ("cached_tokens_total", "counter", "Prompt tokens reused from a slot's cache.",
     lambda e, st, up: st.cached_tokens),
    ("tokens_predicted_total", "counter", "Tokens generated.",
     lambda e, st, up: st.generated_tokens),
    ("draft_tokens_total", "counter", "Prompt-lookup draft tokens verified.",
     lambda e, st, up: st.drafted_tokens),
    ("draft_tokens_accepted_total", "counter", "Draft tokens kept.",
     lambda e, st, up: st.accepted_tokens),
    ("tokens_predicted_per_second", "gauge", "Generated tokens per second of uptime.",
     lambda e, st, up: f"{st.generated_tokens / up:.3f}"),
    ("requests_processing", "gauge", "Sequences in a slot.", lambda e, st, up: e.n_running),
    ("requests_deferred", "gauge", "Requests waiting for a slot.",
     lambda e, st, up: e.n_waiting),
    ("slots", "gauge", "Slots (sequences computed together).", lambda e, st, up: e.n_slots),
)
_HISTOGRAMS = (("ttft", "time_to_first_token", "Seconds from request to first token."),
               ("duration", "request_duration", "Seconds from request to its end."))


class ServerMetrics:
    """What the server counts beside the engine, and the ``/metrics`` text."""

    def __init__(self) -> None:
        self.stats = {"requests": 0, "errors": 0, "disconnects": 0, "busy_rejections": 0}
        self.latency = {what: [0] * (len(BUCKETS) + 1) for what, _, _ in _HISTOGRAMS}
        self.latency_sum = {what: 0.0 for what, _, _ in _HISTOGRAMS}

    def count(self, what: str) -> None:
        self.stats[what] += 1

    def observe(self, what: str, seconds: float) -> None:
        i = next((i for i, b in enumerate(BUCKETS) if seconds <= b), len(BUCKETS))
        self.latency[what][i] += 1
        self.latency_sum[what] += seconds

    def ended(self, seq: Any) -> None:
        """A sequence's latencies (its ``timings``) into the histograms."""
        t = seq.timings
        if t.first_token:
            self.observe("ttft", t.first_token - t.submitted)
        self.observe("duration", t.ended - t.submitted)

    def text(self, engine: Any) -> str:
        """Prometheus' text format of the engine's counts and the histograms."""
        uptime = max(time.time() - engine.started, 1e-9)
        lines = []
        for name, kind, help_, read in METRICS:
            lines += [f"# HELP gguflm_{name} {help_}", f"# TYPE gguflm_{name} {kind}"]
            value = read(engine, engine.stats, uptime)
            if isinstance(value, dict):
                lines += [f"gguflm_{name}{{{labels}}} {v}" for labels, v in value.items()]
            else:
                lines.append(f"gguflm_{name} {value}")
        for what, name, help_ in _HISTOGRAMS:
            lines += self._histogram(what, f"gguflm_{name}_seconds", help_)
        return "\n".join(lines) + "\n"

    def _histogram(self, what: str, name: str, help_: str) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        cum = 0
        for b, n in zip((*BUCKETS, "+Inf"), self.latency[what], strict=True):
            cum += n
            lines.append(f'{name}_bucket{{le="{b}"}} {cum}')
        return lines + [f"{name}_sum {self.latency_sum[what]:.6f}", f"{name}_count {cum}"]
