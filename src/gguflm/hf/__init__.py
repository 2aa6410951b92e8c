"""Models from Hugging Face: references (``hf.co/ORG/REPO[:QUANT]``, ``-hf``), the file a
tag picks, downloads into the shared Hugging Face cache (resumed, sha256-checked), offline
use of that cache. ``huggingface_hub`` (imported on first use) is the Hub client: its API
calls, authentication, errors and metadata requests; the transfer itself is ``download``'s
(see docs/models.md for why)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .refs import HFError, HFRef, is_ref, make_ref, parse_ref, repo_ref


def resolve_ref(text_or_ref: str | HFRef, *,
                progress: Callable[[str, int, int], None] | None = None,
                pattern: str | None = None) -> Path:
    """The local path of a Hugging Face model (downloaded when the cache lacks it; every
    shard of a split one). ``progress(stage, done, total)`` as ``hub.pull``'s;
    ``pattern``: a file name glob that must match one file, instead of the tag rule."""
    from .resolve import resolve

    ref = parse_ref(text_or_ref) if isinstance(text_or_ref, str) else text_or_ref
    return resolve(ref, progress=progress, pattern=pattern)


__all__ = ["HFError", "HFRef", "is_ref", "make_ref", "parse_ref", "repo_ref", "resolve_ref"]
