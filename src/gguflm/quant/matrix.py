"""QMatrix: a 2-D weight kept in its ggml encoding, multiplied without a float32 copy.

The model holds every weight as a QMatrix over the memory-mapped tensor bytes, so resident
memory stays near the file size. Products go to a numba kernel that works on the quantized
blocks directly when one exists for the type (``quant/kernels``); every other type takes
a correct fallback that dequantizes a bounded tile of rows at a time and hands it to BLAS.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from gguflm.gguf.types import GGMLType

from .kerneltypes import KERNEL_TYPES

# Rows per dequantized fallback tile: at most this many float32 bytes live at once.
_TILE_BYTES = 8 << 20


class QMatrix:
    """A ``(d_out, d_in)`` weight matrix (numpy order) in its ggml encoding.

    ``raw`` is the tensor's zero-copy view: ``uint8 (d_out, row_bytes)`` for block types,
    a typed ``(d_out, d_in)`` array for F32/F16 (BF16 as ``uint16``).
    """

    __slots__ = ("type", "shape", "raw", "name", "_round", "_fast", "_kind", "_plans")

    def __init__(self, type: GGMLType, raw: np.ndarray, shape: tuple[int, int], name: str = ""):
        d_out, d_in = (int(s) for s in shape)
        type = GGMLType(type)
        if d_in % type.block_size:
            raise ValueError(f"{name or 'matrix'}: row length {d_in} is not a multiple of "
                             f"the {type.ggml_name} block size {type.block_size}")
        if type.quantized:
            raw = raw.reshape(d_out, type.row_bytes(d_in))
        else:
            raw = raw.reshape(d_out, d_in)
        self.type = type
        self.shape = (d_out, d_in)
        self.raw = raw
        self.name = name
        # the product's dispatch, decided once per weight rather than on every call
        self._round = _ACTIVATION_ROUNDING.get(type)
        self._fast = _fast_path(type)
        self._kind = int(type)
        self._plans: dict[tuple[int, ...], Any] = {}  # matmul_many's, this matrix first

    @classmethod
    def from_tensor(cls, t: Any) -> QMatrix:
        """Wrap a 2-D ``TensorInfo`` (from ``gguflm.gguf.open``) without copying its bytes."""
        shape = tuple(t.np_shape)
        if len(shape) != 2:
            raise ValueError(f"{t.name}: expected a 2-D tensor, got shape {shape}")
        return cls(t.type, t.data, shape, name=t.name)

    def __repr__(self) -> str:
        return f"QMatrix({self.name or '?'}, {self.type.ggml_name}, {self.shape})"

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    # -- products --------------------------------------------------------------------------
    def matmul(self, x: np.ndarray, out: np.ndarray | None = None,
               bias: np.ndarray | None = None) -> np.ndarray:
        """``x (n, d_in) f32 @ W.T (+ bias (d_out,)) -> (n, d_out) f32``; writes into
        ``out`` when given. The bias is added to each finished product, as ``y += bias``
        after it would (the float kernels add it as they store each product).

        Without ``out``, 6 or 7 rows past a multiple of 8 are padded with copies of the
        last row for the integer kernels (PAD_ROWS_FROM; the result is a view of the
        padded product's first n rows). Each row's products are its own: the same
        numbers whatever the other rows, and from any range of this matrix's rows."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"{self!r}: matmul wants (n, {self.shape[1]}), got {x.shape}")
        n = x.shape[0]
        res = out
        if res is None:
            rows = padded_rows(n) if self._fast is _quantized_kernel else n
            if rows > n:
                x = np.concatenate((x, np.repeat(x[-1:], rows - n, axis=0)))
            res = np.empty((rows, self.shape[0]), dtype=np.float32)
        if n == 0:
            return res
        if self._round is not None:  # ggml converts x to the weight's type first
            x = self._round(x)
        self._product(x, res, bias)
        return res if len(res) == n else res[:n]

    def _product(self, x: np.ndarray, res: np.ndarray, bias: np.ndarray | None) -> None:
        """``matmul``'s product of x, already in the weight's activation type."""
        if self._fast is _f16_kernel and (bias is None or bias.shape == self.shape[:1]):
            _f16_kernel(self, x, res, bias)
            return
        if self._fast is None or not self._fast(self, x, res):
            self._matmul_tiles(x, res)
        if bias is not None:
            res += bias

    def matvec(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``W (d_out, d_in) @ x (d_in,) -> (d_out,)`` f32."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"{self!r}: matvec wants a vector of {self.shape[1]}, got {x.shape}")
        res = self.matmul(x[None, :], None if out is None else out.reshape(1, -1))
        return res[0]

    def rows(self, ids: Any) -> np.ndarray:
        """Rows ``ids`` as float32 ``(len(ids), d_in)``: an embedding lookup that
        dequantizes only the rows asked for."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.shape[0]):
            bad = ids[(ids < 0) | (ids >= self.shape[0])][0]
            raise IndexError(f"{self!r}: row {int(bad)} out of range")
        return self.dequantize_rows(self.raw[ids])

    def dequantize_rows(self, raw_rows: np.ndarray) -> np.ndarray:
        """Float32 ``(k, d_in)`` from ``k`` rows of this matrix's raw encoding."""
        k, d_in = raw_rows.shape[0], self.shape[1]
        if self.type == GGMLType.F32:
            return np.array(raw_rows, dtype=np.float32)
        if self.type == GGMLType.F16:
            return raw_rows.astype(np.float32)
        from gguflm.quant import dequantize_raw  # the quant package; imported late on purpose

        return dequantize_raw(self.type, raw_rows, (k, d_in))  # float32 (k, d_in)

    def _matmul_tiles(self, x: np.ndarray, out: np.ndarray) -> None:
        """Fallback: dequantize ``tile`` rows at a time and multiply them in the fixed-order
        float kernel (``floatdot``: not BLAS, whose order changes with the batch)."""
        from gguflm.quant.floatdot import f32_matmul

        d_out, d_in = self.shape
        tile = max(16, _TILE_BYTES // (4 * d_in))
        parallel = x.shape[0] * d_out * d_in >= PARALLEL_MIN_MACS
        part = np.empty((x.shape[0], tile), np.float32)
        for r0 in range(0, d_out, tile):
            r1 = min(d_out, r0 + tile)
            w = np.ascontiguousarray(self.dequantize_rows(self.raw[r0:r1]), np.float32)
            f32_matmul(x, w, part[:, :r1 - r0], parallel)
            out[:, r0:r1] = part[:, :r1 - r0]


# Rows past a multiple of 8 from which a product's rows are padded to the next multiple
# (``QMatrix.matmul``): they then run as 1x8 tiles instead of a 1x4 tile and 1x1 passes,
# or, for a big matrix, a stream: 8 rows run faster than 7.
PAD_ROWS_FROM = 6


def padded_rows(n: int) -> int:
    """The rows a product of n activation rows runs with (see PAD_ROWS_FROM)."""
    return n + 8 - n % 8 if n % 8 >= PAD_ROWS_FROM else n

# Below this many multiply-adds a product runs on one thread: waking the pool costs more
# (much less when its workers spin: entry_point_defaults(owns_cores=True))
PARALLEL_MIN_MACS = 1 << 21
ROWSPLIT_MIN_ROWS = 16  # quant/rowsplit: activation rows per thread worth sharing out
SPIN_PARALLEL_MIN_MACS = 1 << 18


def matmul_many(mats: Sequence[QMatrix], x: np.ndarray,
                biases: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
    """``[m.matmul(x, bias=b) for m, b in zip(mats, biases)]``, the same numbers, in one
    kernel call when every matrix has an integer kernel (Q, K and V; gate and up): ``x`` is
    quantized once and all their rows share one parallel region instead of one region per
    product (a call per MAX_FUSED matrices beyond that); for float weights x is converted
    once."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    from gguflm.quant.kernels import MAX_FUSED

    biases = list(biases) if biases is not None else [None] * len(mats)
    if len(mats) > MAX_FUSED:  # calls of MAX_FUSED products
        return [y for i in range(0, len(mats), MAX_FUSED)
                for y in matmul_many(mats[i:i + MAX_FUSED], x, biases[i:i + MAX_FUSED])]
    n = x.shape[0] if x.ndim == 2 else 0
    plan = _plan(mats) if n else None
    if plan is None or x.shape[1] != mats[0].shape[1]:
        return _each(mats, x, biases)
    kinds, ws, rows, count = plan
    outs = [np.empty((n, r), np.float32) for r in rows]
    padded = tuple(outs) + (outs[0],) * (len(ws) - count)
    _run_plan(kinds, ws, x, padded, count, n * x.shape[1] * sum(rows) >= PARALLEL_MIN_MACS)
    for y, b in zip(outs, biases, strict=True):
        if b is not None:
            y += b
    return outs


def _each(mats: Sequence[QMatrix], x: np.ndarray, biases: list[np.ndarray | None]
          ) -> list[np.ndarray]:
    """``[m.matmul(x, bias=b) ...]``, x converted once to the weights' activation type
    when they share it (F16 Q, K and V)."""
    rnd = mats[0]._round
    if rnd is None or x.ndim != 2 or not len(x) \
            or any(m._round is not rnd or m.shape[1] != x.shape[1] for m in mats):
        return [m.matmul(x, bias=b) for m, b in zip(mats, biases, strict=True)]
    xr = rnd(x)
    outs = [np.empty((len(x), m.shape[0]), np.float32) for m in mats]
    for m, out, b in zip(mats, outs, biases, strict=True):
        m._product(xr, out, b)
    return outs


class ExpertWeights:
    """M matrices of every expert (gate and up; or down) as ``expert_products`` takes them.
    ``usable`` is False, and ``why`` says why, when some expert's weights have no integer
    kernel or are not laid out as one (rows, row bytes) array each (F16 experts, say:
    those run expert by expert)."""

    def __init__(self, *per_matrix: Sequence[QMatrix]) -> None:
        first = per_matrix[0][0]
        self.rows, self.d_in = first.shape
        self.shape = tuple(first.raw.shape) if first.raw.ndim == 2 else (0, 0)
        self.why = next((why for ms in per_matrix for m in ms
                         if (why := self._unusable(m, ms[0], first))), "")
        self.usable = not self.why
        self.kinds = np.array([int(ms[0].type) for ms in per_matrix], np.int64)
        self.ptrs = np.array([[m.raw.ctypes.data if self.usable else 0 for m in ms]
                              for ms in per_matrix], np.int64)
        self._mats = per_matrix  # the weights the addresses point into, kept alive

    def _unusable(self, m: QMatrix, same_type: QMatrix, first: QMatrix) -> str:
        """Why expert matrix ``m`` cannot join the others in one call, or ''."""
        if m.type not in KERNEL_TYPES or m.type != same_type.type:
            return f"{m.name or m.type.ggml_name} is {m.type.ggml_name}: no integer kernel"
        if (m.shape != first.shape or m.raw.dtype != np.uint8
                or tuple(m.raw.shape) != self.shape or not m.raw.flags.c_contiguous):
            return f"{m.name}: weights not laid out as the first expert's"
        return ""

    def __call__(self, x: np.ndarray, experts: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """(M, S, rows) f32: ``expert_products`` of these weights, x (S, K) a row per slot."""
        from .expert_products import expert_products  # numba: imported at first use

        out = np.empty((len(self.kinds), len(x), self.rows), np.float32)
        return expert_products(self.kinds, self.ptrs, self.shape, x, experts, starts, out)


def _plan(mats: Sequence[QMatrix]) -> Any:
    """What ``kernels.qmatmul_planned`` needs for these matrices (type ids, weights padded
    to MAX_FUSED, rows, count), checked once and kept on the first matrix; None when they
    cannot share a call."""
    first = mats[0]
    key = tuple(mats[1:])  # the others themselves: the dict holds them, so no key is reused
    plan = first._plans.get(key, False)
    if plan is not False:
        return plan
    from gguflm.quant import kernels

    plan = None
    if (len(mats) <= kernels.MAX_FUSED and all(m._fast is _quantized_kernel for m in mats)
            and len({m.shape[1] for m in mats}) == 1
            and len({m.raw.flags.writeable for m in mats}) == 1):
        kinds, ws = kernels.pad_products([m._kind for m in mats], [m.raw for m in mats])
        plan = (kinds, ws, [m.shape[0] for m in mats], len(mats))
    first._plans[key] = plan
    return plan


_THREADS = threading.local()  # set_threads' count per calling thread


def threads() -> int:
    """The threads the kernels run on in this thread: what ``set_threads`` set here (kept:
    numba's own query costs microseconds, and a token asks twice per layer), else numba's
    count."""
    n = getattr(_THREADS, "n", 0)
    if n:
        return n
    import numba

    return numba.get_num_threads()


def _run_plan(kinds: np.ndarray, ws: tuple[np.ndarray, ...], x: np.ndarray,
             outs: tuple[np.ndarray, ...], count: int, parallel: bool) -> None:
    from gguflm.quant import kernels

    kernels.qmatmul_planned(kinds, ws, x, outs, count, parallel)


def _f32_product(m: QMatrix, x: np.ndarray, out: np.ndarray) -> bool:
    from gguflm.quant.floatdot import f32_matmul  # fixed order per element, not BLAS

    f32_matmul(x, np.ascontiguousarray(m.raw), out,
               parallel=x.shape[0] * m.shape[0] * m.shape[1] >= PARALLEL_MIN_MACS)
    return True


def _quantized_kernel(m: QMatrix, x: np.ndarray, out: np.ndarray) -> bool:
    plan = _plan((m,))
    if (plan is None or out.dtype != np.float32 or not out.flags.c_contiguous
            or out.shape != (x.shape[0], m.shape[0])):  # the checked path says what is wrong
        from gguflm.quant import kernels

        kernels.qmatmul(m._kind, m.raw, x, out,
                        parallel=x.shape[0] * m.shape[0] * m.shape[1] >= PARALLEL_MIN_MACS)
        return True
    kinds, ws, _, _ = plan
    _run_plan(kinds, ws, x, (out,) * len(ws), 1,
             x.shape[0] * m.shape[0] * m.shape[1] >= PARALLEL_MIN_MACS)
    return True


def _f16_kernel(m: QMatrix, x: np.ndarray, out: np.ndarray,
                bias: np.ndarray | None = None) -> bool:
    # every batch size here, never BLAS: each element is summed in the same order
    # whatever the batch (the serving engine's determinism rule); BF16 too (int16 bits)
    from gguflm.quant import kernels
    from gguflm.quant.float_tiles import NO_BIAS, STREAM_CHUNK, bf16_bits, f16_matmul_rows_bias

    w = bf16_bits(m.raw) if m.type == GGMLType.BF16 else m.raw.view(np.uint16)
    b, on = (NO_BIAS, 0) if bias is None else (np.ascontiguousarray(bias, np.float32), 1)
    if x.shape[0] * m.shape[0] * m.shape[1] >= PARALLEL_MIN_MACS:
        if m.shape[0] < 2 * STREAM_CHUNK and x.shape[0] >= 2 * ROWSPLIT_MIN_ROWS:
            from gguflm.quant.rowsplit import f16_matmul_xrows  # one weight chunk: split x

            f16_matmul_xrows(w, x, out, b, on)
        else:
            kernels.f16_matmul_par(w, x, out, b, on)
    else:
        f16_matmul_rows_bias(w, x, out, 0, m.shape[0], b, on)
    return True


def _round_f16(x: np.ndarray) -> np.ndarray:
    from gguflm.quant.float_tiles import rounded_f16, rounded_f16_par  # numba: on first use

    return (rounded_f16_par if x.size >= ROUND_PARALLEL_MIN else rounded_f16)(x)


ROUND_PARALLEL_MIN = 1 << 16  # values from which _round_f16 shares out the rows


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even) -> float32, as ggml's fp32_to_bf16."""
    from gguflm.quant.float_tiles import rounded_bf16, rounded_bf16_par  # numba: on first use

    return (rounded_bf16_par if x.size >= ROUND_PARALLEL_MIN else rounded_bf16)(x)


# F16/BF16 weights multiply activations rounded to their own type, as ggml's vec_dot does
_ACTIVATION_ROUNDING = {GGMLType.F16: _round_f16, GGMLType.BF16: _round_bf16}

def _fast_path(t: GGMLType):  # noqa: ANN202 - returns a private dispatcher or None
    """The kernel dispatcher for type ``t``, or None when only the fallback exists."""
    if t in KERNEL_TYPES:  # the declarations the kernels are built from
        return _quantized_kernel
    if t in (GGMLType.F16, GGMLType.BF16):
        return _f16_kernel
    if t == GGMLType.F32:
        return _f32_product
    return None


def set_threads(n: int | None = None) -> int:
    """Threads for the kernels (``-t N``) in the calling thread, which will run them;
    default: the cores this process may use.

    Also sets this thread's parallel chunk size to 1 (both are numba's per-thread settings):
    a product's few work items are handed out one at a time, so that when a worker waits
    for a core (a shared machine) the other threads take its share instead of waiting for
    it at the end. Set once here rather than around every product (a context manager
    there cost about 10 us a call)."""
    import numba

    if n is None or n <= 0:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = max(1, min(int(n or 1), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    numba.set_parallel_chunksize(1)
    _THREADS.n = n
    return n


_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")


def limit_blas_threads(n: int = 1) -> bool:
    """Run numpy's OpenBLAS on ``n`` threads; True when it could be set.

    Our products run in the numba kernels; BLAS only sees the small attention products,
    and its idle workers spin for a long while after each one, taking the cores our kernels
    need (prompt processing ran several times slower with OpenBLAS's default threads). An
    explicit ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` in the environment is left alone.
    """
    if "OPENBLAS_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return False
    import ctypes
    import glob

    libs_dir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(libs_dir, "*openblas*")):
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy: the same handle
        except OSError:
            continue
        for name in _BLAS_SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                return True
    return False


def entry_point_defaults(owns_cores: bool = False, serving: bool = False) -> None:
    """The process-wide settings gguflm's entry points (the CLI, ``LLM()``) choose.

    Importing gguflm changes nothing; this is called by the code that owns the process.
    - How idle OpenMP workers wait between our parallel products. Read by the OpenMP
      runtime when numba first starts it, so this must run before the first product.
      - By default they sleep (``OMP_WAIT_POLICY=passive``): between products the model
        runs serial code, and spinning workers would take the core that code or the host
        program needs. ``LLM()`` (a library in someone else's process) keeps this.
      - ``serving``: ``gguflm serve``. Workers spin briefly after each product
        (``OMP_WAIT_POLICY=active``, ``GOMP_SPINCOUNT=20000``, tens of microseconds, then
        they sleep): long enough to bridge the gaps between one step's products, short
        enough to give the cores back to the event loop between steps (figures: the
        server's section of docs/performance.md).
      - ``owns_cores``: one user's command (``gguflm run``, ``chat``, ``bench``,
        ``perplexity``), where nothing else of ours needs the cores. Workers spin longer
        (``GOMP_SPINCOUNT=100000``), and products down to ``SPIN_PARALLEL_MIN_MACS`` run
        on all threads. Measured on SmolLM2 generation, 2 threads: about 1.2x the
        tokens/s of sleeping workers (llama.cpp's threads poll too).
    - numpy's OpenBLAS on one thread (``limit_blas_threads``).
    - ``owns_cores`` or ``serving``: freed memory kept for the next step
      (``keep_freed_memory``).
    An explicit choice in the environment wins over each.
    """
    global PARALLEL_MIN_MACS
    if "OMP_WAIT_POLICY" not in os.environ:
        spin = "100000" if owns_cores else "20000" if serving else None
        ours = {"OMP_WAIT_POLICY": "active" if spin else "passive"}
        if spin and "GOMP_SPINCOUNT" not in os.environ:
            ours["GOMP_SPINCOUNT"] = spin
        if owns_cores:
            PARALLEL_MIN_MACS = SPIN_PARALLEL_MIN_MACS
        os.environ.update(ours)
        # what was set here, so that benchmarks can leave llama.cpp's own defaults alone
        os.environ["GGUFLM_OMP_DEFAULTED"] = ",".join(ours)
    limit_blas_threads()
    if owns_cores or serving:
        keep_freed_memory()


# glibc's mallopt parameters: blocks from this size are mapped apart (and unmapped when
# freed); the heap's free top is given back to the system from this size
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest
TRIM_THRESHOLD = 512 << 20


def keep_freed_memory() -> None:
    """Keep the memory a forward pass frees for the next one (glibc only; an explicit
    ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` wins). By default glibc maps
    each block from 128 KiB apart and unmaps it when freed (the threshold then grows with
    the blocks freed) and hands the heap's free top back: a 512-token prompt's products
    and activations then took fresh pages every layer, about 1.3 million page faults in
    seven passes of a 1B model and a tenth of the prompt's time (docs/performance.md).
    Blocks up to 32 MiB now come from the heap, which keeps up to 512 MiB free."""
    if not sys.platform.startswith("linux") or any(
            k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
