"""Hugging Face checkpoints (``config.json`` + ``*.safetensors`` + ``tokenizer.json``) to the
GGUF files llama.cpp's ``convert_hf_to_gguf.py`` writes, without torch or transformers.

``convert(folder, outfile=None, outtype="auto") -> Path``; architectures in ``REGISTRY``.
"""

from .base import REGISTRY
from .core import OUTTYPES, convert
from .errors import ConvertError

__all__ = ["OUTTYPES", "REGISTRY", "ConvertError", "convert"]
