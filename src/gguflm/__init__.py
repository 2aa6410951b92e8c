"""gguflm: read, check, write and run GGUF model files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import LLM as LLM
    from .api import InvalidRequestError as InvalidRequestError
    from .chatformat import ChatFormat as ChatFormat
    from .model import Model
    from .tokenizer import Tokenizer as Tokenizer

__version__ = "0.1.0"
__all__ = ["LLM", "ChatFormat", "InvalidRequestError", "Tokenizer", "load_model",
           "__version__"]


def load_model(path: str | os.PathLike[str], kv_overrides: Mapping[str, Any] | None = None,
               rope_style: str | None = None) -> Model:
    """Open a GGUF model file and load it for inference (``gguflm.model.load_model``:
    ``kv_overrides`` replace metadata values, ``rope_style`` the RoPE pairing).

    Imported lazily so that ``import gguflm`` stays light.
    """
    from .model import load_model as _load_model

    return _load_model(path, kv_overrides, rope_style)


def __dir__() -> list[str]:
    # the public names (LLM and Tokenizer are imported lazily, so not in globals() yet),
    # the submodules imported so far and the dunders; not the helpers imported above
    subs = {k for k, v in globals().items() if type(v) is type(os) and k != "os"}
    return sorted(set(__all__) | subs | {k for k in globals() if k.startswith("__")})


def __getattr__(name: str):
    # ``gguflm.Tokenizer`` without importing the tokenizer (and regex) on ``import gguflm``
    if name == "Tokenizer":
        from .tokenizer import Tokenizer

        return Tokenizer
    if name == "ChatFormat":  # the chat-format layer (chatformat/), also lazily
        from .chatformat import ChatFormat

        return ChatFormat
    if name in ("LLM", "InvalidRequestError"):  # the Python API (api.py), also lazily
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'gguflm' has no attribute {name!r}")
