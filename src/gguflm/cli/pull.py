"""``gguflm pull [NAME ...]``: fetch known models, or Hugging Face models
(``hf.co/ORG/REPO[:QUANT]``), into their caches, progress on stderr.

Also home of ``StderrProgress``/``resolve``, which other commands use so that a model
pulled on first use shows its progress the same way, and of llama.cpp's ``-hf`` options
(``add_hf_options``/``finish_hf_options``), which every command taking a MODEL has.
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
    """Renders ``hub.pull`` progress: one updating line with a bar on a terminal, otherwise
    one line per stage (so that CI logs stay short). A stage starting ``note:`` is a
    message, printed as a line either way."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._stage: str | None = None
        self._last = 0.0
        self._width = 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage.startswith("note:"):
            self.end_line()
            self.stream.write(stage + "\n")
            self.stream.flush()
            return
        new_stage = stage != self._stage
        if new_stage:
            self.end_line()
            self._stage = stage
        if self.tty:
            now = time.monotonic()
            finished = total and done >= total
            if new_stage or finished or now - self._last >= 0.1:
                self._last = now
                line = f"{stage}{_bar(done, total)} {_amount(done, total)}".rstrip()
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


def _bar(done: int, total: int) -> str:
    filled = min(20, 20 * done // total) if total else 0
    return f" [{'#' * filled}{'.' * (20 - filled)}]" if total else ""


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


def _pull_hf(name: str, force: bool) -> None:
    """``gguflm pull hf.co/...``: every file of the model in the Hugging Face cache."""
    from .. import hf
    from . import UsageError

    if force:
        raise UsageError("--force: a Hugging Face download is checked against the Hub's "
                         "sha256 and never needs fetching again; delete it from the cache "
                         "to fetch it anew")
    start = time.monotonic()
    progress = StderrProgress()
    try:
        path = hf.resolve_ref(name, progress=progress)
    finally:
        progress.end_line()
    print(f"{name}: {path} ({time.monotonic() - start:.1f} s)", file=sys.stderr)


def add_hf_options(p: argparse.ArgumentParser) -> None:
    """llama.cpp's ``-hf ORG/REPO[:QUANT]``, ``-hff FILE``, ``-hft TOKEN`` and
    ``--offline``: the model from Hugging Face (``finish_hf_options`` makes MODEL of them)."""
    g = p.add_argument_group("models from Hugging Face (docs/models.md)")
    g.add_argument("-hf", "-hfr", "--hf-repo", metavar="ORG/REPO[:QUANT]",
                   help="the model from this Hugging Face repository: the file of the "
                        "quantization QUANT (any case; default Q4_K_M, then Q8_0, then the "
                        "first GGUF), all its shards, downloaded once into the Hugging Face "
                        "cache; the same as MODEL hf.co/ORG/REPO:QUANT")
    g.add_argument("-hff", "--hf-file", metavar="FILE",
                   help="this file of the -hf repository (instead of the QUANT tag)")
    g.add_argument("-hft", "--hf-token", metavar="TOKEN",
                   help="Hugging Face access token, for gated and private models "
                        "(default: $HF_TOKEN)")
    g.add_argument("--offline", action="store_true",
                   help="use the Hugging Face cache only, never the network (as "
                        "HF_HUB_OFFLINE=1)")


def finish_hf_options(args: argparse.Namespace) -> None:
    """After parsing: ``-hf``/``-hff`` become MODEL ``hf.co/...`` (a UsageError beside
    another MODEL, or for ``-hff`` alone); ``-hft``/``--offline`` become the environment
    the download reads (HF_TOKEN, HF_HUB_OFFLINE: the command owns its process)."""
    import os

    from .. import hf
    from . import UsageError

    repo, file = getattr(args, "hf_repo", None), getattr(args, "hf_file", None)
    if getattr(args, "hf_token", None):
        os.environ["HF_TOKEN"] = args.hf_token
    if getattr(args, "offline", False):
        os.environ["HF_HUB_OFFLINE"] = "1"
    if file and not repo:
        raise UsageError("-hff/--hf-file names a file of the -hf repository: give -hf too")
    if not repo:
        return
    if args.model is not None:
        raise UsageError(f"two models given: {args.model} and -hf {repo}")
    try:
        args.model = str(hf.repo_ref(repo, file or ""))
    except hf.HFError as e:
        raise UsageError(f"-hf {repo}: {e}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    known = ", ".join(hub.KNOWN_MODELS)
    p = subparsers.add_parser(
        "pull", help="fetch known models or Hugging Face models into the local cache",
        description=f"Fetch known models ({known}) into the cache "
                    "($GGUFLM_HOME, else ~/.cache/gguflm), or Hugging Face models "
                    "(hf.co/ORG/REPO[:QUANT], every shard of a split one) into the Hugging "
                    "Face cache ($HF_HOME/hub). A cached model is not fetched again "
                    "(docs/models.md).")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"model names or hf.co/ORG/REPO[:QUANT] (default: {hub.DEFAULT_MODEL})")
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
    from .. import hf

    names = args.names or [hub.DEFAULT_MODEL]
    for name in names:  # every name is checked before anything is fetched
        hf.parse_ref(name) if hf.is_ref(name) else hub.known_model(name)
    for name in names:
        if hf.is_ref(name):
            _pull_hf(name, args.force)
            continue
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
