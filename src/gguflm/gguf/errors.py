"""The GGUFError hierarchy: every problem with a file says what, where and why."""

from __future__ import annotations


class GGUFError(Exception):
    """A GGUF file (or a request about one) is invalid.

    ``offset`` is the byte offset in the file where the problem was found (or None),
    ``key``/``tensor`` name the metadata key or tensor involved, ``reason`` the why.
    """

    def __init__(
        self,
        reason: str,
        *,
        offset: int | None = None,
        key: str | None = None,
        tensor: str | None = None,
        path: str | None = None,
    ) -> None:
        self.reason = reason
        self.offset = offset
        self.key = key
        self.tensor = tensor
        self.path = path
        super().__init__(self._format())

    def _format(self) -> str:
        parts = []
        if self.path:
            parts.append(str(self.path))
        if self.offset is not None:
            parts.append(f"offset {self.offset} (0x{self.offset:x})")
        if self.key is not None:
            parts.append(f"key {self.key!r}")
        if self.tensor is not None:
            parts.append(f"tensor {self.tensor!r}")
        where = ", ".join(parts)
        return f"{where}: {self.reason}" if where else self.reason

    def with_path(self, path: str) -> GGUFError:
        return self.located(path=path)

    def located(self, *, path: str | None = None, key: str | None = None,
                tensor: str | None = None) -> GGUFError:
        """This error with ``path``/``key``/``tensor`` filled in by a caller that knows them."""
        if path is not None:
            self.path = path
        if key is not None:
            self.key = key
        if tensor is not None:
            self.tensor = tensor
        self.args = (self._format(),)
        return self


class MagicError(GGUFError):
    """Not a GGUF file (includes old ggml/ggmf/ggjt/ggla files, named as such)."""


class VersionError(GGUFError):
    """Unsupported GGUF version."""


class TruncatedError(GGUFError):
    """The file ends before a field it declares: bytes wanted vs bytes left."""


class MetadataError(GGUFError):
    """A metadata key or value is invalid (empty/duplicate key, bad type, bad alignment...)."""


class TensorInfoError(GGUFError):
    """A tensor description is invalid (name, dims, type, offset)."""


class TensorDataError(GGUFError):
    """Tensor data is missing, out of bounds, or the wrong size for its type and shape."""


class WriteError(GGUFError):
    """A value or tensor cannot be written as GGUF."""


class GGUFWarning(UserWarning):
    """A file we can read but llama.cpp would refuse (e.g. arrays of arrays)."""
