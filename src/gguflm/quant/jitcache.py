"""Whether numba functions' machine code is already cached on disk (then a start loads it
in about a second; otherwise the first call compiles it). The one home of this probe of
numba's cache index, which the kernels, the quantizers and the model's warm-up share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def cached(fns: Iterable[Any]) -> bool:
    """True when every numba dispatcher in ``fns`` has machine code in its on-disk cache."""
    try:
        return all(len(fn._cache._cache_file._load_index()) > 0 for fn in fns)
    except Exception:  # noqa: BLE001 - numba internals moved: assume the slow path
        return False
