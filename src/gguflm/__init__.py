"""gguflm: read, check, write and run GGUF model files."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .api import LLM as LLM
    from .api import InvalidRequestError as InvalidRequestError
    from .model import Model
    from .tokenizer import Tokenizer as Tokenizer

__version__ = "0.1.0"


def load_model(path: str | os.PathLike[str]) -> Model:
    """Open a GGUF model file and load it for inference (``gguflm.model.load_model``).

    Imported lazily so that ``import gguflm`` stays light.
    """
    from .model import load_model as _load_model

    return _load_model(path)


def __getattr__(name: str):
    # ``gguflm.Tokenizer`` without importing the tokenizer (and regex) on ``import gguflm``
    if name == "Tokenizer":
        from .tokenizer import Tokenizer

        return Tokenizer
    if name in ("LLM", "InvalidRequestError"):  # the Python API (api.py), also lazily
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'gguflm' has no attribute {name!r}")
