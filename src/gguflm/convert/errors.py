"""The converter's error: what is wrong with which file of the checkpoint."""

from __future__ import annotations

from ..gguf.errors import GGUFError


class ConvertError(GGUFError):
    """A Hugging Face checkpoint cannot be converted: a missing or malformed file, an
    unsupported architecture or tokenizer, a tensor that maps to nothing. ``path`` names
    the file, ``tensor``/``key`` the tensor or config field."""
