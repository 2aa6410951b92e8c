"""Models: GGUF weights and metadata -> logits, one file per architecture in ``archs/``.

``load_model(path)`` opens the file, picks the architecture registered for its
``general.architecture``, checks the config and every tensor's shape, and returns a
``Model`` whose weights stay quantized in the memory-mapped file.
"""

from __future__ import annotations

import os

from ..gguf.errors import GGUFError
from ..gguf.reader import GGUFFile
from ..gguf.reader import open as open_gguf
from .base import Model
from .config import ModelConfig
from .kv_cache import ContextFullError, KVCache

__all__ = ["ContextFullError", "KVCache", "Model", "ModelConfig", "load_model", "from_gguf"]


def from_gguf(gguf: GGUFFile) -> Model:
    """A Model for an already opened file (errors name the key or tensor at fault)."""
    from . import archs

    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        from ..gguf.errors import MetadataError

        raise MetadataError("missing: not a model file (a vocabulary-only file?)",
                            key="general.architecture")
    if not gguf.tensors:
        raise GGUFError("the file has no tensors: a vocabulary-only file, not a model",
                        path=gguf.path)
    try:
        return archs.get(arch).from_gguf(gguf)
    except GGUFError as e:
        raise e.with_path(gguf.path) from None


def load_model(path: str | os.PathLike[str]) -> Model:
    """Open a GGUF model file and load it for inference."""
    gguf = open_gguf(path)
    try:
        return from_gguf(gguf)
    except BaseException:
        gguf.close()
        raise
