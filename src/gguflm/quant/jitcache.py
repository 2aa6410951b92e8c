"""numba's disk cache for gguflm's kernels: when cached machine code is stale, and whether
it is there.

numba keys a function's cached machine code by the source of its own file, while the code
holds what it calls from other files (numba links callees into callers) and what the
Python code that builds its IR read from others (type declarations, the SIMD choice).
Every gguflm kernel is therefore stamped here with the sources of its module and of every
gguflm module that module imports, transitively (the import statements, read from the
files), plus the build settings that change code without changing a file (``GGUFLM_SIMD``
and the kernel type declarations as loaded). A change to any of them makes the cached code
stale, and numba compiles it again. ``register()`` installs this stamp for gguflm's own
files (other packages' functions keep numba's own); each module with cached kernels calls
it before its first ``@njit(cache=True)``, and a test checks that every one does.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parents[1]  # src/gguflm


def _module_path(name: str) -> Path | None:
    """The source file of gguflm module ``name`` (dotted, from ``gguflm``), if any."""
    parts = name.split(".")
    if parts[0] != "gguflm":
        return None
    base = _PACKAGE.joinpath(*parts[1:])
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(_PACKAGE).with_suffix("")
    parts = ["gguflm", *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


@functools.cache
def _imports(path: Path, mtime: float, size: int) -> frozenset[Path]:  # noqa: ARG001 - keys
    """The gguflm modules ``path`` imports (anywhere in it, outside ``TYPE_CHECKING``): for
    ``from X import a``, module ``X.a`` where ``a`` is one, else ``X`` itself."""
    tree = ast.parse(path.read_bytes())
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    package = _module_name(path) if path.name == "__init__.py" else \
        _module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" if _module_path(f"{base}.{a.name}") else base
                     for a in node.names]
        else:
            continue
        if _type_checking_only(node, parents):
            continue
        found.update(p for p in map(_module_path, names) if p is not None)
    return frozenset(found)


def _closure(path: Path) -> list[Path]:
    """``path`` and every gguflm module it imports, transitively, sorted."""
    seen, todo = set(), [path]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        st = p.stat()
        todo.extend(_imports(p, st.st_mtime, st.st_size))
    return sorted(seen)


@functools.cache
def _digest(path: Path, mtime: float, size: int) -> bytes:  # noqa: ARG001 - cache keys
    return hashlib.sha256(path.read_bytes()).digest()


def _build_settings() -> str:
    """What changes the kernels' code without changing a file: the forced SIMD flavour and
    the kernel type declarations as loaded."""
    from .kerneltypes import KERNEL_TYPES

    return f"{os.environ.get('GGUFLM_SIMD', '')} {_table_key(tuple(KERNEL_TYPES.items()))}"


@functools.cache
def _table_key(declarations: tuple) -> int:  # noqa: ARG001 - the cache key
    from .kerneltypes import table_key

    return table_key()


@functools.cache
def _sources_digest(path: Path) -> bytes:
    """The sources of ``path`` and of what it imports, transitively, as one digest (read
    once per process: numba compiles a function once per process too)."""
    h = hashlib.sha256()
    for p in _closure(path):
        st = p.stat()
        h.update(str(p.relative_to(_PACKAGE)).encode() + _digest(p, st.st_mtime, st.st_size))
    return h.digest()


def sources_key(source: str | os.PathLike[str]) -> int:
    """The stamp of the kernels in file ``source``: its sources (the file and what it
    imports, transitively) and the build settings, as an integer."""
    h = hashlib.sha256(_build_settings().encode())
    h.update(_sources_digest(Path(source).resolve()))
    return int.from_bytes(h.digest()[:7], "little")


def _make_locator() -> type:
    from numba.core import caching

    class SourcesLocator(caching._CacheLocator):
        """numba's own locator for the file (NUMBA_CACHE_DIR, else ``__pycache__``), with
        ``sources_key`` as the stamp."""

        def __init__(self, base: Any, py_file: str) -> None:
            self._base = base
            self._py_file = py_file

        def get_cache_path(self) -> str:
            return self._base.get_cache_path()

        def get_source_stamp(self) -> Any:
            return sources_key(self._py_file)

        def get_disambiguator(self) -> str:
            return self._base.get_disambiguator()

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            try:
                Path(py_file).resolve().relative_to(_PACKAGE)
            except ValueError:
                return None
            for base_cls in (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator,
                             caching.UserWideCacheLocator):
                base = base_cls.from_function(py_func, py_file)
                if base is not None:
                    return cls(base, py_file)
            return None

    return SourcesLocator


_LOCATOR: type | None = None


def register() -> type:
    """Stamp gguflm's cached kernels with ``sources_key`` (once per process; numba's
    functions elsewhere are left as they are). Returns the locator class."""
    global _LOCATOR
    if _LOCATOR is None:
        from numba.core import caching

        _LOCATOR = _make_locator()
        caching.CacheImpl._locator_classes.insert(0, _LOCATOR)
    return _LOCATOR


def stamped(fn: Any) -> bool:
    """Whether numba dispatcher ``fn`` caches under ``sources_key``."""
    cache = getattr(fn, "_cache", None)
    impl = getattr(cache, "_impl", None)
    return _LOCATOR is not None and isinstance(getattr(impl, "locator", None), _LOCATOR)


def cached(fns: Iterable[Any]) -> bool:
    """True when every numba dispatcher in ``fns`` has machine code in its on-disk cache
    (then a start loads it in about a second; otherwise the first call compiles it)."""
    try:
        return all(len(fn._cache._cache_file._load_index()) > 0 for fn in fns)
    except Exception:  # noqa: BLE001 - numba internals moved: assume the slow path
        return False


register()
