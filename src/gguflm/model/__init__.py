"""Models: GGUF weights and metadata -> logits, one file per architecture in ``archs/``.

``load_model(path)`` opens the file, picks the architecture registered for its
``general.architecture``, checks the config and every tensor's shape, and returns a
``Model`` whose weights stay quantized in the memory-mapped file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..gguf.errors import GGUFError
from ..gguf.reader import GGUFFile
from ..gguf.reader import open as open_gguf
from .base import Model
from .config import ModelConfig
from .kv_cache import ContextFullError, KVCache

__all__ = ["ContextFullError", "KVCache", "Model", "ModelConfig", "load_model", "from_gguf"]


def from_gguf(gguf: GGUFFile, kv_overrides: Mapping[str, Any] | None = None,
              rope_style: str | None = None) -> Model:
    """A Model for an already opened file (errors name the key or tensor at fault).

    ``kv_overrides`` replace metadata values first (``{"llama.rope.freq_base": 1e6}``; see
    overrides.py): the model, its tokenizer and chat template then read them. ``rope_style``
    (``"norm"`` or ``"neox"``) replaces the architecture's RoPE pairing, for a file whose
    Q/K rows were converted for the other one."""
    from . import archs
    from .base import ROPE_STYLES
    from .overrides import apply_kv_overrides

    if rope_style is not None and rope_style not in ROPE_STYLES:
        raise ValueError(f"rope_style must be one of {', '.join(ROPE_STYLES)}, got "
                         f"{rope_style!r}")
    if kv_overrides:
        try:
            apply_kv_overrides(gguf.metadata, kv_overrides)
        except GGUFError as e:
            raise e.with_path(gguf.path) from None

    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        from ..gguf.errors import MetadataError

        raise MetadataError("missing: not a model file (a vocabulary-only file?)",
                            key="general.architecture")
    if not gguf.tensors:
        raise GGUFError("the file has no tensors: a vocabulary-only file, not a model",
                        path=gguf.path)
    try:
        return archs.get(arch).from_gguf(gguf, rope_style)
    except GGUFError as e:
        raise e.with_path(gguf.path) from None


def load_model(path: str | os.PathLike[str], kv_overrides: Mapping[str, Any] | None = None,
               rope_style: str | None = None) -> Model:
    """Open a GGUF model file and load it for inference (``kv_overrides`` and
    ``rope_style``: see ``from_gguf``)."""
    gguf = open_gguf(path)
    try:
        return from_gguf(gguf, kv_overrides, rope_style)
    except BaseException:
        gguf.close()
        raise
