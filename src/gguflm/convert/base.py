"""What one architecture's converter declares: the Hugging Face architectures it takes, its
GGUF architecture, tensor names, any tensor rewrite (Llama's Q/K permutation), its keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .errors import ConvertError
from .params import Config, block_count, check_attention

REGISTRY: dict[str, type[ModelConverter]] = {}
Keys = list[tuple[str, Any, Any]]


def register(*hf_architectures: str):  # noqa: ANN201 - a class decorator
    def add(cls: type[ModelConverter]) -> type[ModelConverter]:
        for name in hf_architectures:
            REGISTRY[name] = cls
        return cls
    return add


class ModelConverter:
    """Base: ``tensor_name`` maps a checkpoint name to a GGUF one (None: not written)."""

    gguf_arch: ClassVar[str]

    def __init__(self, folder: Path, config: Config, file_type: int) -> None:
        self.folder, self.config, self.file_type = folder, config, file_type
        self.n_layers = block_count(config)
        check_attention(config)

    def tensor_name(self, name: str) -> str | None:
        raise NotImplementedError

    def unmapped(self, name: str) -> None:
        """(The caller adds the file the tensor is in.)"""
        raise ConvertError(f"cannot map it to a {self.gguf_arch} tensor", tensor=name)

    def modify(self, gguf_name: str, data: np.ndarray) -> np.ndarray:
        """The tensor as written (of shape ``out_shape``); most write it unchanged."""
        return data

    def out_shape(self, gguf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The numpy shape ``modify`` gives a tensor of checkpoint shape ``shape`` (a
        ConvertError when the config and the shape disagree, found before writing)."""
        return shape

    def forced_f32(self, gguf_name: str) -> bool:
        """Tensors the converter keeps in F32 beyond 1-D ones, norms and biases."""
        return False

    def parameters(self) -> Keys:
        raise NotImplementedError

    def vocabulary(self) -> Keys:
        raise NotImplementedError
