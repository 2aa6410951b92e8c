"""Kernel variants chosen by measuring the machine: which of the row kernels' run-time
variants (``int_tiles.WALKS``: how decoding walks a matrix's rows as streams for the
hardware prefetchers, for short rows and for long ones, ``int_tiles.LONG_ROW_BYTES``) is
fastest on this CPU, measured once and remembered beside the compiled kernels, keyed by the
CPU.

Every variant gives the same numbers (each row's dot is its own), so the choice changes
only speed. The measurement: one activation row times a matrix of random weights of the
model's most common integer type, large enough to stream from memory (``MATRIX_BYTES``,
beyond the largest caches), with rows of ``ROW_VALUES[c]`` values for each class c, one
thread, the variants alternating for ``ROUNDS`` rounds (a busy machine slows them alike),
each variant's median. The default, four streams, is kept unless another is faster by
``MARGIN`` in every round, so a noisy measurement does not move it. It takes about a
second; the result is written to ``calibration.json`` in the kernels' cache folder
(numba's ``NUMBA_CACHE_DIR``, else the package's ``__pycache__``, else the user's cache),
one entry per CPU key, and read back by later runs. ``gguflm bench --kernels`` prints it
(``describe``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from ..gguf.types import GGMLType
from . import int_tiles, jitcache, vector_ir  # noqa: F401 - jitcache: stamps _run_items
from .formats import FORMATS
from .products import run_item

MATRIX_BYTES = 96 << 20  # past a CPU's last-level cache (32-96 MB on today's desktops)
ROUNDS = 5
MARGIN = 0.10  # how much faster a variant must be, in every round, to replace the default
DEFAULT_WALK = 0
ROW_VALUES = (2048, 8192)  # a short row (attention, an FFN's gate and up), a long one (down)
CLASSES = ("short rows", "long rows")
_FILE = "calibration.json"
_VERSION = 2

_chosen: dict[str, Any] | None = None  # this process's choice, once made or read


def cpu_key() -> str:
    """What the choice depends on: the CPU model, the SIMD flavour the kernels are built
    for, the CPU features they use (``_cpu_part``), and the kernels' code (its sources'
    stamp: a changed kernel is measured again)."""
    return f"{_cpu_part()}{jitcache.sources_key(int_tiles.__file__):x}"


def _cpu_part() -> str:
    """``cpu_key`` up to the kernels' stamp: the same CPU's entries for other kernels
    start with it."""
    feats = ",".join(f for f, on in (("vnni", vector_ir.VNNI), ("wide", vector_ir.WIDE),
                                     ("gfni", vector_ir.GFNI)) if on)
    return f"{_cpu_model()} | {vector_ir.SIMD} {feats} | v{_VERSION} | kernels "


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cache_file() -> Path:
    """Where the choices are kept: beside numba's cache of the kernels."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parent / "__pycache__",
                   Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gguflm"]
    for folder in candidates:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder / _FILE
        except OSError:
            continue
    return candidates[-1] / _FILE


def _read_all(path: Path) -> dict[str, Any]:
    """The file's entries; an unreadable or foreign file counts as empty (it is only a
    cache: measured again, and rewritten)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Keep ``entry`` under ``key``, dropping the same CPU's entries for other kernels."""
    data = {k: v for k, v in _read_all(path).items() if not k.startswith(_cpu_part())}
    data[key] = entry
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: the choice holds for this process only
        tmp.unlink(missing_ok=True)


def _valid(entry: object) -> bool:
    """Whether a kept entry is one ``measure`` wrote (the file is only a cache, and may have
    been edited or written by another version): else it is measured again."""
    if not isinstance(entry, dict):
        return False

    def ints(xs: object, n: int, top: int | None = None) -> bool:
        return (isinstance(xs, list) and len(xs) == n and all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < (top or 2**31)
            for x in xs))

    rates = entry.get("gb_per_s")
    return (ints(entry.get("walks"), len(CLASSES), len(int_tiles.WALKS))
            and isinstance(rates, list) and len(rates) == len(CLASSES)
            and all(isinstance(r, list) and len(r) == len(int_tiles.WALKS)
                    and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                            for x in r) for r in rates)
            and isinstance(entry.get("type"), str) and isinstance(entry.get("when"), str)
            and ints([entry.get("matrix_mb"), entry.get("rounds")], 2))


def _apply(entry: dict[str, Any]) -> dict[str, Any]:
    global _chosen
    for slot, walk in zip(int_tiles.WALK_SETTINGS, entry["walks"], strict=True):
        int_tiles.kernel_settings()[slot] = walk
    _chosen = dict(entry)
    return _chosen


def ensure(kinds: list[int] | set[int]) -> dict[str, Any] | None:
    """This CPU's choice: as already made in this process, read from the cache file, or
    measured now with the most common integer-kernel type of ``kinds`` (the first of
    ``kinds`` that has an integer kernel; None, nothing measured, when none has: the
    walk is the integer row kernels')."""
    if _chosen is not None:
        return _chosen
    path = cache_file()
    entry = _read_all(path).get(cpu_key())
    if _valid(entry):
        return _apply(entry)
    kind = _measure_type(kinds)
    if kind is None:
        return None
    entry = measure(kind)
    _write(path, cpu_key(), entry)
    return _apply(entry)


def _measure_type(kinds: list[int] | set[int]) -> int | None:
    from .kerneltypes import KERNEL_TYPES

    ids = [int(k) for k in kinds if int(k) in GGMLType._value2member_map_
           and GGMLType(int(k)) in KERNEL_TYPES]
    return ids[0] if ids else None


def _random_blocks(kind: int, nbytes: int) -> np.ndarray:
    """About ``nbytes`` of blocks of type ``kind`` (a whole number of the longest rows):
    random bytes with normal float scales (no subnormals, whose arithmetic is slow on some
    CPUs)."""
    fmt = FORMATS[GGMLType(kind)]
    per_row = max(ROW_VALUES) // fmt.block_size
    n = max(64, nbytes // (per_row * fmt.type_size)) * per_row
    blk = np.random.default_rng(0).integers(0, 256, (n, fmt.type_size), dtype=np.uint8)
    for f in fmt.fields:
        if f.kind == "f16":
            blk[:, f.offset:f.offset + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        elif f.name == "e":  # MXFP4's E8M0 exponent
            blk[:, f.offset] = 120
    return blk


def measure(kind: int) -> dict[str, Any]:
    """Each walk's streaming rate (GB/s, the median of ``ROUNDS`` alternating rounds) for
    each class of rows, on ``MATRIX_BYTES`` of matrices of type ``kind`` shaped as a 2-3B
    model's (``_SHAPES``) times one row, cut into work items as decoding on two threads
    cuts them, one thread; and the walks chosen (``choose``)."""
    int_tiles.prepare([kind])
    fmt = FORMATS[GGMLType(kind)]
    blk = _random_blocks(kind, MATRIX_BYTES)
    t0 = time.perf_counter()
    walks, rates = [], []
    for slot, values in zip(int_tiles.WALK_SETTINGS, ROW_VALUES, strict=True):
        w = blk.reshape(-1, values // fmt.block_size * fmt.type_size)
        rows = min(_SHAPES[values], w.shape[0])
        mats = [w[r:r + rows] for r in range(0, w.shape[0] - rows + 1, rows)]
        times = _timed_walks(kind, mats, slot)
        walks.append(choose(times))
        nbytes = sum(m.nbytes for m in mats)
        rates.append([round(nbytes / statistics.median(times[v]) / 1e9, 2)
                      for v in sorted(times)])
    return {"walks": walks, "gb_per_s": rates, "type": GGMLType(kind).ggml_name,
            "matrix_mb": blk.nbytes >> 20, "rounds": ROUNDS,
            "seconds": round(time.perf_counter() - t0, 2),
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}


# rows of a matrix whose rows have this many values: an FFN's gate (8192 x 2048) and down
# (2048 x 8192) of a Llama-3.2-1B
_SHAPES = {2048: 8192, 8192: 2048}


def _timed_walks(kind: int, mats: list[np.ndarray], slot: int) -> dict[int, list[float]]:
    """Each walk's times, round by round, for one row times each of ``mats``, cut into
    the work items two threads' decoding takes (``products.work_items``)."""
    from .act_quant import activation_sets
    from .products import work_items
    from .vector_ir import F16_TABLE

    fmt = FORMATS[GGMLType(kind)]
    x = np.random.default_rng(1).standard_normal(
        (1, mats[0].shape[1] // fmt.type_size * fmt.block_size)).astype(np.float32)
    kinds = np.array([kind])
    a32, ak = activation_sets(kinds, 1, x)
    outs = (np.empty((1, mats[0].shape[0]), np.float32),)
    items = work_items((mats[0],), 1, 1, 2)  # every matrix has the same shape
    settings = int_tiles.kernel_settings()
    before = settings[slot]
    times: dict[int, list[float]] = {v: [] for v in range(len(int_tiles.WALKS))}

    def run() -> None:
        for m in mats:
            _run_items(kinds, (m,), a32, ak, F16_TABLE, outs, items)

    try:
        run()  # the pages mapped, the kernel loaded
        for _ in range(ROUNDS):
            for v, ts in times.items():
                settings[slot] = v
                t = time.perf_counter()
                run()
                ts.append(time.perf_counter() - t)
    finally:
        settings[slot] = before
    return times


@njit(cache=True, nogil=True)
def _run_items(kinds, ws, a32, ak, tbl, outs, items):  # noqa: ANN001, ANN202
    """``products.run_item`` for each of ``items``, one after another (one thread)."""
    for c in range(items.shape[0]):
        run_item(kinds, ws, a32, ak, tbl, outs, items, c)


def choose(times: dict[int, list[float]]) -> int:
    """The walk to run from each walk's times, round by round: the fastest median among
    the default and those faster than it by ``MARGIN`` in every round."""
    base = times[DEFAULT_WALK]
    fast = [v for v, ts in times.items()
            if v == DEFAULT_WALK or all(a * (1 + MARGIN) <= b for a, b in zip(ts, base,
                                                                               strict=True))]
    return min(fast, key=lambda v: (statistics.median(times[v]), v))


def describe(entry: dict[str, Any] | None = None) -> list[str]:
    """What runs and why, as lines (``gguflm bench --kernels``): the SIMD flavour and the
    features the kernels use, the interleaved GEMM's types, and the measured choice."""
    from .int_gemm import GEMM_KINDS, GEMM_MIN_ROWS

    forced = os.environ.get("GGUFLM_SIMD", "")
    why = f"forced by GGUFLM_SIMD={forced}" if forced else "this CPU's best"
    feats = [name for name, on in (("VNNI", vector_ir.VNNI),
                                   ("512-bit tiles", vector_ir.WIDE),
                                   ("GFNI", vector_ir.GFNI)) if on]
    gemm = ", ".join(GGMLType(k).ggml_name for k in GEMM_KINDS if k >= 0)
    lines = [f"CPU: {_cpu_model()}",
             f"SIMD: {vector_ir.SIMD} ({why}); uses {', '.join(feats) or 'no extensions'}",
             f"interleaved GEMM (prompts of {GEMM_MIN_ROWS}+ rows): "
             f"{gemm or 'none on this CPU: the per-row tiles'}"]
    entry = entry or _chosen
    if entry is None:
        return [*lines, "decoding's row walk: not measured yet"]
    lines.append(f"decoding's row walk, measured {entry.get('when', '?')} ({entry['type']}, "
                 f"{entry['matrix_mb']} MB, one thread, median of {entry['rounds']} rounds; "
                 f"kept in {cache_file()}, key {cpu_key()}):")
    for c, (name, values) in enumerate(zip(CLASSES, ROW_VALUES, strict=True)):
        walk = entry["walks"][c]
        reason = (f"the default: no other faster by {MARGIN:.0%} in every round"
                  if walk == DEFAULT_WALK else
                  f"faster than the default by {MARGIN:.0%} or more in every round")
        rates = "; ".join(f"{w} {r} GB/s" for w, r in zip(int_tiles.WALKS,
                                                           entry["gb_per_s"][c], strict=False))
        lines += [f"  {name} ({values} values): {int_tiles.WALKS[walk]}, {reason}",
                  f"    {rates}"]
    return lines
