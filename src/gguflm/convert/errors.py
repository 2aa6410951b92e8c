"""The converter's error: what is wrong with which file of the checkpoint."""

from __future__ import annotations

from ..gguf.errors import GGUFError

MAX_SHOWN = 200  # characters of a key or tensor name in a message (a header may hold 1 MB)


class ConvertError(GGUFError):
    """A Hugging Face checkpoint cannot be converted: a missing or malformed file, an
    unsupported architecture or tokenizer, a tensor that maps to nothing. ``path`` names
    the file, ``tensor``/``key`` the tensor or config field (names from a hostile file
    shortened, so that the error stays one readable line)."""

    def __init__(self, reason: str, *, offset: int | None = None, key: str | None = None,
                 tensor: str | None = None, path: str | None = None) -> None:
        super().__init__(reason, offset=offset, key=_short(key), tensor=_short(tensor),
                         path=path)

    def located(self, *, path: str | None = None, key: str | None = None,
                tensor: str | None = None) -> GGUFError:
        return super().located(path=path, key=_short(key), tensor=_short(tensor))


def _short(name: str | None) -> str | None:
    return name if name is None or len(name) <= MAX_SHOWN else name[:MAX_SHOWN] + "..."
