"""``gguflm pull [NAME ...]``: fetch known models into the cache, progress on stderr.

Also home of ``stderr_progress``/``resolve``, which other commands use so that a model
pulled on first use shows its progress the same way.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from .. import hub

# sizes are shown in MB of 10^6 bytes everywhere (pull, inspect, bench, the README)
MB = 1e6


class StderrProgress:
    """Renders ``hub.pull`` progress: one updating line on a terminal, otherwise one line
    per stage (so that CI logs stay short)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._stage: str | None = None
        self._last = 0.0
        self._width = 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        new_stage = stage != self._stage
        if new_stage:
            self.end_line()
            self._stage = stage
        if self.tty:
            now = time.monotonic()
            finished = total and done >= total
            if new_stage or finished or now - self._last >= 0.1:
                self._last = now
                line = f"{stage} {_amount(done, total)}".rstrip()
                self.stream.write("\r" + line.ljust(self._width))
                self._width = len(line)
                self.stream.flush()
        elif new_stage:
            size = f" ({total / MB:.1f} MB)" if total else ""
            self.stream.write(f"{stage}{size}\n")
            self.stream.flush()

    def end_line(self) -> None:
        """Finish the current terminal line (call before printing anything else)."""
        if self.tty and self._stage is not None:
            self.stream.write("\n")
            self.stream.flush()
        self._stage = None
        self._width = 0


def _amount(done: int, total: int) -> str:
    if total:
        return f"{done / MB:.1f}/{total / MB:.1f} MB {100 * done // total:3d}%"
    return f"{done / MB:.1f} MB" if done else ""


def resolve(name_or_path: str) -> Path:
    """``hub.resolve_model`` with pull progress shown on stderr (for CLI commands)."""
    progress = StderrProgress()
    try:
        return hub.resolve_model(name_or_path, progress=progress)
    finally:
        progress.end_line()


def register(subparsers: argparse._SubParsersAction) -> None:
    known = ", ".join(hub.KNOWN_MODELS)
    p = subparsers.add_parser(
        "pull", help="fetch known models into the local cache",
        description=f"Fetch known models ({known}) into the cache "
                    "($GGUFLM_HOME, else ~/.cache/gguflm). A cached model is not fetched again.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"model names (default: {hub.DEFAULT_MODEL})")
    p.add_argument("--force", action="store_true",
                   help="fetch again even when the model is already cached")
    p.add_argument("--list", action="store_true",
                   help="list the known models and whether each is cached")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name, m in hub.KNOWN_MODELS.items():
            state = "cached" if hub.is_cached(name) else "not cached"
            default = " (default)" if name == hub.DEFAULT_MODEL else ""
            print(f"{name}{default}: {m.description}; {m.size / MB:.0f} MB, {state}")
            print(f"    {hub.cached_path(name)}")
        return 0
    names = args.names or [hub.DEFAULT_MODEL]
    for name in names:
        hub.known_model(name)  # every name is checked before anything is fetched
    for name in names:
        start = time.monotonic()
        cached = not args.force and hub.is_cached(name)
        progress = StderrProgress()
        try:
            path = hub.pull(name, progress=progress, force=args.force)
        finally:
            progress.end_line()
        how = "already cached" if cached else f"pulled in {time.monotonic() - start:.1f} s"
        print(f"{name}: {path} ({how})", file=sys.stderr)
    return 0
