"""The architecture registry: ``general.architecture`` -> the Model subclass that runs it.

Each module in this package is one architecture and registers itself with ``@register``.
Modules are discovered (not listed), so adding an architecture is adding one file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from ...gguf.errors import MetadataError
from ..base import Model

_REGISTRY: dict[str, type[Model]] = {}
_discovered = False


def register(*names: str) -> Callable[[type[Model]], type[Model]]:
    """Class decorator: run files whose ``general.architecture`` is one of ``names``."""
    def deco(cls: type[Model]) -> type[Model]:
        for name in names:
            if name in _REGISTRY and _REGISTRY[name] is not cls:
                raise RuntimeError(f"architecture {name!r} registered twice")
            _REGISTRY[name] = cls
        return cls
    return deco


def _discover() -> None:
    global _discovered
    if not _discovered:
        for mod in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{mod.name}")
        _discovered = True


def supported() -> list[str]:
    """Names of the architectures this build can run, sorted."""
    _discover()
    return sorted(_REGISTRY)


def get(name: str) -> type[Model]:
    """The Model class for ``general.architecture`` == name, or a MetadataError naming it
    and the supported list."""
    _discover()
    cls = _REGISTRY.get(name)
    if cls is None:
        raise MetadataError(f"unknown architecture {name!r} (supported: "
                            f"{', '.join(supported())})", key="general.architecture")
    return cls
