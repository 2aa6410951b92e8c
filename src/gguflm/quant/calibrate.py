"""Kernel variants chosen by measuring the machine: which of the row kernels' run-time
variants (``int_tiles.WALKS``: how decoding walks a matrix's rows as streams for the
hardware prefetchers) is fastest on this CPU, measured once and remembered beside the
compiled kernels, keyed by the CPU.

Every variant gives the same numbers (each row's dot is its own), so the choice changes
only speed. The measurement: one activation row times a matrix of random weights of the
model's most common integer type, large enough to stream from memory (``MATRIX_BYTES``,
beyond the largest caches), one thread, the variants alternating for ``ROUNDS`` rounds
(a busy machine slows them alike), each variant's median. The default, four streams, is
kept unless another is faster by ``MARGIN`` in the medians and in every round, so a noisy
measurement does not move it. It takes under a second; the result is written to
``calibration.json`` in the kernels' cache folder (numba's ``NUMBA_CACHE_DIR``, else the
package's ``__pycache__``, else the user's cache), one entry per CPU key, and read back by
later runs. ``gguflm bench --kernels`` prints it (``describe``).
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

from ..gguf.types import GGMLType
from . import int_tiles, vector_ir
from .formats import FORMATS

MATRIX_BYTES = 96 << 20  # past a CPU's last-level cache (32-96 MB on today's desktops)
ROUNDS = 5
MARGIN = 0.10  # how much faster a variant must be, in every round, to replace the default
DEFAULT_WALK = 0
_FILE = "calibration.json"
_VERSION = 1

_chosen: dict[str, Any] | None = None  # this process's choice, once made or read


def cpu_key() -> str:
    """What the choice depends on: the CPU model, the SIMD flavour the kernels are built
    for and the CPU features they use."""
    feats = ",".join(f for f, on in (("vnni", vector_ir.VNNI), ("wide", vector_ir.WIDE),
                                     ("gfni", vector_ir.GFNI)) if on)
    return f"{_cpu_model()} | {vector_ir.SIMD} {feats} | v{_VERSION}"


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
    data = _read_all(path)
    data[key] = entry
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: the choice holds for this process only
        tmp.unlink(missing_ok=True)


def _apply(entry: dict[str, Any]) -> dict[str, Any]:
    global _chosen
    walk = entry.get("walk")
    if not isinstance(walk, int) or not 0 <= walk < len(int_tiles.WALKS):
        walk = DEFAULT_WALK
    int_tiles.kernel_settings()[int_tiles.WALK_SETTING] = walk
    _chosen = dict(entry, walk=walk)
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
    if isinstance(entry, dict) and isinstance(entry.get("gb_per_s"), list):
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


def _random_weights(kind: int, nbytes: int) -> np.ndarray:
    """A matrix of about ``nbytes`` of type ``kind``, rows of 4096 values: random bytes
    with normal float scales (no subnormals, whose arithmetic is slow on some CPUs)."""
    fmt = FORMATS[GGMLType(kind)]
    per_row = 4096 // fmt.block_size
    rows = max(64, nbytes // (per_row * fmt.type_size))
    blk = np.random.default_rng(0).integers(0, 256, (rows * per_row, fmt.type_size),
                                            dtype=np.uint8)
    for f in fmt.fields:
        if f.kind == "f16":
            blk[:, f.offset:f.offset + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        elif f.name == "e":  # MXFP4's E8M0 exponent
            blk[:, f.offset] = 120
    return blk.reshape(rows, per_row * fmt.type_size)


def measure(kind: int) -> dict[str, Any]:
    """Each walk's streaming rate (GB/s, the median of ``ROUNDS`` alternating rounds) on a
    ``MATRIX_BYTES`` matrix of type ``kind`` times one row, one thread, and the walk
    chosen: the default unless another is faster by ``MARGIN`` in every round."""
    from .products import qmatmul

    int_tiles.prepare([kind])
    w = _random_weights(kind, MATRIX_BYTES)
    fmt = FORMATS[GGMLType(kind)]
    x = np.random.default_rng(1).standard_normal(
        (1, w.shape[1] // fmt.type_size * fmt.block_size)).astype(np.float32)
    out = np.empty((1, w.shape[0]), np.float32)
    settings, slot = int_tiles.kernel_settings(), int_tiles.WALK_SETTING
    before = settings[slot]
    times: dict[int, list[float]] = {v: [] for v in range(len(int_tiles.WALKS))}
    t0 = time.perf_counter()
    try:
        qmatmul(kind, w, x, out, parallel=False)  # the pages mapped, the kernel loaded
        for _ in range(ROUNDS):
            for v, ts in times.items():
                settings[slot] = v
                t = time.perf_counter()
                qmatmul(kind, w, x, out, parallel=False)
                ts.append(time.perf_counter() - t)
    finally:
        settings[slot] = before
    rate = {v: w.nbytes / statistics.median(ts) / 1e9 for v, ts in times.items()}
    return {"walk": choose(times), "type": GGMLType(kind).ggml_name,
            "matrix_mb": w.nbytes >> 20,
            "rounds": ROUNDS, "gb_per_s": [round(rate[v], 2) for v in sorted(rate)],
            "seconds": round(time.perf_counter() - t0, 2),
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}


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
    rates = "; ".join(f"{name} {r} GB/s" for name, r in zip(int_tiles.WALKS,
                                                             entry["gb_per_s"], strict=False))
    walk = int_tiles.WALKS[entry["walk"]]
    reason = (f"the default: no other faster by {MARGIN:.0%} in every round"
              if entry["walk"] == DEFAULT_WALK else
              f"faster than the default by {MARGIN:.0%} or more in every round")
    return [*lines,
            f"decoding's row walk: {walk}, {reason}",
            f"  measured {entry.get('when', '?')}: {entry['type']}, {entry['matrix_mb']} MB, "
            f"one thread, median of {entry['rounds']} rounds: {rates}",
            f"  kept in {cache_file()} (key: {cpu_key()})"]
