"""The key/value cache: per sequence and layer, the keys and values of every position so far.

A ``KVArena`` holds the memory for ``n_slots`` sequences of up to ``n_ctx`` positions each
(llama.cpp's KV cache with several ``seq_id``s); a ``KVCache`` is one slot of it: one
sequence's cached positions. Several sequences in one forward batch must share an arena, so
that attention over all of them is one kernel call per layer.

Layout, chosen for the attention kernel (``model/attention.py``):
  keys   (n_layer, n_slots, n_head_kv, n_ctx / TILE, head_dim, TILE): each TILE of positions
         stored transposed, so a query's scores against a tile are one vectorized pass over
         contiguous memory with a fixed summation order per score;
  values (n_layer, n_slots, n_head_kv, n_ctx, head_dim_v).
With ``f16`` (the default) keys and values are stored as float16 (their bits, uint16: numba
has no float16 type), as in llama.cpp's default F16 cache: half the memory of float32, and
half the bytes attention reads per position; the kernel converts them exactly
(``vcvtph2ps``). With ``q8_0`` each position's key and value of a KV head is a row of ggml
Q8_0 blocks (``kv_q8``): keys and values (n_layer, n_slots, n_head_kv, n_ctx, bytes) int8,
34 bytes per 32 numbers, 53% of f16's memory. The memory is anonymous and committed only
when written (see ``_lazy_zeros``), so it grows with use.
Positions are absolute: slot position i holds the sequence's token i. Each slot also keeps
the ids of its positions (``KVCache.ids``, int32: the one record of what a slot holds,
which the engine's prefix reuse reads).

Layers of multi-head latent attention (``layer.LatentAttention``: DeepSeek-V2/V3) keep
one row per position instead, the compressed latent and the rotated key part (kv_lora +
n_rot numbers, shared by every head: ``KVShape.latent``), float16 or float32; their
values are the rows' first kv_lora numbers, so nothing else is stored.

Recurrent layers (a gated delta net: ``layer.DeltaNet``; a short convolution:
``layer.ShortConv``, whose state has no matrices) keep no positions but a fixed-size
state per slot (``RecurrentShape``): the last d_conv - 1 inputs of the convolution
(``conv``) and the delta rule's matrices (``ssm``), float32, where the attention layers
keep keys and values. Such a state folds in every position so far and cannot be cut back;
a cache with one (``rewinds`` False) keeps snapshots of it instead (``KVCache``). A
forward pass stages its new states and ``Batch.advance`` commits them.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import numpy as np

# Positions per key tile (a multiple of the vector width; 64 floats = 4 cache lines).
TILE = 64

# A recurrent cache's snapshots of its state (llama.cpp's context checkpoints): one after
# every batch of more than one row for the sequence (a prompt chunk: where a next turn or
# a shared system prompt resumes) and one every CHECKPOINT_EVERY decoded positions; the
# oldest dropped beyond MAX_CHECKPOINTS. Each is one copy of every recurrent layer's state.
MAX_CHECKPOINTS = 8
CHECKPOINT_EVERY = 256


class ContextFullError(ValueError):
    """More tokens than the cache has room for (a prompt longer than the context)."""


def _lazy_zeros(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    """A zeroed array whose pages the kernel commits only when they are written.

    Not np.zeros: numpy asks for transparent huge pages on large arrays, and then writing
    a few positions in each (layer, head) slice commits a 2 MiB page per slice, i.e. the
    whole cache at once (a 4096-token SmolLM2 cache: 190 MB resident after one token).
    """
    count = 1
    for d in shape:
        count *= d
    size = np.dtype(dtype).itemsize
    buf = mmap.mmap(-1, max(count * size, 1))
    return np.frombuffer(buf, dtype, count=count).reshape(shape)


@dataclass(frozen=True)
class RecurrentShape:
    """The per-slot state of a model's recurrent layers (all alike)."""

    n_layer: int    # recurrent layers
    conv_rows: int  # inputs the convolution keeps (d_conv - 1)
    conv_dim: int   # channels of the convolution
    n_head: int     # value heads, each with a (head_dim x head_dim) state (0: none)
    head_dim: int

    @property
    def slot_bytes(self) -> int:
        return 4 * self.n_layer * (self.conv_rows * self.conv_dim
                                   + self.n_head * self.head_dim * self.head_dim)


class ArenaTooLargeError(ValueError):
    """A cache that this machine's memory could never hold (the message says what fits)."""


def _machine_bytes() -> int:
    """Physical memory plus swap: the most a cache could ever commit here."""
    import os

    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("SwapTotal:"):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total


# The cache's number types, by llama.cpp's -ctk/-ctv names: f16 (llama.cpp's default), f32,
# and q8_0 (ggml Q8_0 blocks: ``kv_q8``)
KV_TYPES = ("f16", "f32", "q8_0")
QK8, BLOCK8 = 32, 34  # a Q8_0 block: 32 numbers in 34 bytes (float16 scale, 32 int8)


def check_kv_type(kv_type: str, head_dim: int, head_dim_v: int, latent: bool = False
                  ) -> None:
    """A ValueError naming what is wrong, unless ``kv_type`` is a cache type the heads can
    be stored in (Q8_0 rows need head sizes that are multiples of 32, as in ggml; a
    ``latent`` layer's rows are float16 or float32 only)."""
    if kv_type not in KV_TYPES:
        raise ValueError(f"KV cache type {kv_type!r} is not one of {', '.join(KV_TYPES)}")
    if latent and kv_type == "q8_0":
        raise ValueError("a q8_0 KV cache is not supported for multi-head latent attention "
                         "(its cached latent is f16 or f32)")
    if kv_type == "q8_0" and (head_dim % QK8 or head_dim_v % QK8):
        raise ValueError(f"a q8_0 KV cache needs head sizes that are multiples of {QK8} "
                         f"(ggml's Q8_0 block); this model's are {head_dim} and {head_dim_v}")


def _position_bytes(kv_type: str, n_ctx: int, head_dim: int, head_dim_v: int) -> int:
    """Bytes of one slot's keys and values of one layer and KV head (all n_ctx positions)."""
    if kv_type == "q8_0":
        return n_ctx * (head_dim + head_dim_v) // QK8 * BLOCK8
    itemsize = 2 if kv_type == "f16" else 4
    return itemsize * (-(-n_ctx // TILE) * TILE * head_dim + n_ctx * head_dim_v)


@dataclass(frozen=True)
class KVShape:
    """One attention layer's keys and values per position: KV heads and head sizes. A
    ``latent`` layer (multi-head latent attention: ``layer.LatentAttention``) keeps one row
    of head_dim numbers per position, [latent | rotated key], whose first head_dim_v are
    its values: (n_slots, n_ctx, head_dim) in the arena's ``k``, None in its ``v``."""

    n_head_kv: int
    head_dim: int
    head_dim_v: int
    latent: bool = False

    @property
    def f16_position_bytes(self) -> int:
        """Bytes of one position of this layer in an F16 cache."""
        return 2 * (self.head_dim if self.latent
                    else self.n_head_kv * (self.head_dim + self.head_dim_v))

    def slot_bytes(self, kv_type: str, n_ctx: int) -> int:
        """Bytes of one slot's n_ctx positions of this layer."""
        if self.latent:
            return n_ctx * self.head_dim * (2 if kv_type == "f16" else 4)
        return self.n_head_kv * _position_bytes(kv_type, n_ctx, self.head_dim,
                                                self.head_dim_v)


def check_arena_fits(n_slots: int, n_ctx: int, layers: list[KVShape | None],
                     kv_type: str = "f16", extra_slot_bytes: int = 0) -> None:
    """Refuse, before anything is allocated, a cache whose full size exceeds the machine's
    memory (mapping it fails, or a full context is killed later): ArenaTooLargeError saying
    how many positions per slot, and how many slots, would fit. ``layers``: each layer's
    shape (None: a layer that stores none)."""
    def layer_bytes(n: int) -> int:
        return sum(s.slot_bytes(kv_type, n) for s in layers if s is not None)

    per_slot = layer_bytes(n_ctx) + extra_slot_bytes
    need, have = per_slot * n_slots, _machine_bytes()
    if need <= have:
        return
    per_position = layer_bytes(TILE) / TILE
    ctx_fits = int(have // max(per_position * n_slots, 1)) // TILE * TILE
    slots_fit = have // max(per_slot, 1)
    raise ArenaTooLargeError(
        f"the KV cache for {n_slots} slot(s) of {n_ctx} positions needs {need / 2**30:.1f} "
        f"GiB, more than this machine's {have / 2**30:.1f} GiB of memory: at most "
        f"{ctx_fits} positions per slot fit with {n_slots} slot(s)"
        + (f", or {slots_fit} slot(s) of {n_ctx}" if slots_fit else ""))


class KVArena:
    """Cache memory for ``n_slots`` sequences of up to ``n_ctx`` positions each, its
    numbers of type ``kv_type`` (``KV_TYPES``). Every layer alike (``k``, ``v``: one array,
    layer first), or, with ``layers``, each its own shape (``k``, ``v``: one array per
    layer; None for a layer that reads another's: Gemma 4's shared KV layers)."""

    def __init__(self, n_layer: int, n_slots: int, n_ctx: int, n_head_kv: int, head_dim: int,
                 head_dim_v: int, kv_type: str = "f16",
                 recurrent: RecurrentShape | None = None,
                 layers: tuple[KVShape | None, ...] | None = None) -> None:
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be at least 1, got {n_ctx}")
        if n_slots < 1:
            raise ValueError(f"n_slots must be at least 1, got {n_slots}")
        uniform = layers is None
        if uniform:
            layers = (KVShape(n_head_kv, head_dim, head_dim_v),) * n_layer
        for s in {s for s in layers if s is not None}:
            check_kv_type(kv_type, s.head_dim, s.head_dim_v, s.latent)
        check_arena_fits(n_slots, n_ctx, list(layers), kv_type,
                         (2 + MAX_CHECKPOINTS) * recurrent.slot_bytes if recurrent else 0)
        self.n_ctx = n_ctx
        self.n_slots = n_slots
        self.kv_type = kv_type
        self.head_dim_v = head_dim_v
        self.head_dims_v = tuple(None if s is None else s.head_dim_v for s in layers)
        # llama.cpp's default cache type is F16: keys and values are stored as F16, and
        # attention rounds its other operands as ggml does.
        # Measured against llama.cpp's logits: Gemma 3's worst de-shifted step 2.17 -> 1.86,
        # the Q4_0 tiny Llama's 1.31 -> 0.63, SmolLM2's perplexity -0.42% -> +0.004%.
        self.f16 = kv_type == "f16"
        if uniform:
            self.k, self.v = self._keys_values((n_layer, n_slots), layers[0])
        else:
            kv = [None if s is None else self._keys_values((n_slots,), s) for s in layers]
            self.k = [None if p is None else p[0] for p in kv]
            self.v = [None if p is None else p[1] for p in kv]
        self.recurrent = recurrent
        r = recurrent or RecurrentShape(0, 0, 0, 0, 0)
        # per recurrent layer and slot: the convolution's last inputs, the delta-rule state
        # (head, value dim j, key dim i), as ggml's gated_delta_net holds S transposed;
        # twice: a forward pass writes the slot's spare copy, and its advance makes that
        # the live one (``live``), so a pass that fails midway leaves the state as it was
        self.conv = _lazy_zeros((2, r.n_layer, n_slots, r.conv_rows, r.conv_dim))
        self.ssm = _lazy_zeros((2, r.n_layer, n_slots, r.n_head, r.head_dim, r.head_dim))
        self.live = np.zeros(n_slots, np.int64)
        self.states = [_SlotState(np.zeros(n_ctx, np.int32)) for _ in range(n_slots)]

    def _keys_values(self, lead: tuple[int, ...], s: KVShape
                     ) -> tuple[np.ndarray, np.ndarray | None]:
        """Zeroed keys and values of ``lead`` (layers and) slots of shape ``s`` (a latent
        layer's rows, position by position, and no values: they are in the rows)."""
        if s.latent:
            return _lazy_zeros((*lead, self.n_ctx, s.head_dim),
                               np.uint16 if self.f16 else np.float32), None
        lead = (*lead, s.n_head_kv)
        if self.kv_type == "q8_0":  # one row of ggml blocks per position (kv_q8)
            return (_lazy_zeros(lead + (self.n_ctx, s.head_dim // QK8 * BLOCK8), np.int8),
                    _lazy_zeros(lead + (self.n_ctx, s.head_dim_v // QK8 * BLOCK8), np.int8))
        dtype = np.uint16 if self.f16 else np.float32  # float16 bits
        return (_lazy_zeros(lead + (-(-self.n_ctx // TILE), s.head_dim, TILE), dtype),
                _lazy_zeros(lead + (self.n_ctx, s.head_dim_v), dtype))

    @property
    def slots(self) -> list[KVCache]:
        """A view of each slot. The views hold the arena, the arena holds no view (a slot's
        bookkeeping is its ``states`` entry): a cache dropped by its last user frees its
        memory at once, not at the next garbage collection (perplexity makes one a chunk)."""
        return [KVCache(self, i) for i in range(self.n_slots)]

    @property
    def nbytes(self) -> int:
        kv = (a.nbytes for a in ((self.k, self.v) if isinstance(self.k, np.ndarray)
                                 else (*self.k, *self.v)) if a is not None)
        return sum(kv) + self.conv.nbytes + self.ssm.nbytes

    def state(self, slot: int, spare: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Views of slot ``slot``'s recurrent state, every recurrent layer: (conv
        (n_layer, conv_rows, conv_dim), ssm (n_layer, n_head, head_dim, head_dim)), the
        live copy or the spare one a forward pass writes."""
        i = int(self.live[slot]) ^ int(spare)
        return self.conv[i, :, slot], self.ssm[i, :, slot]

    def store(self, layer: int, slot: np.ndarray, pos: np.ndarray, k: np.ndarray,
              v: np.ndarray) -> None:
        """Write k (T, n_head_kv, head_dim) and v (T, n_head_kv, head_dim_v) of layer
        ``layer`` for rows whose sequence is ``slot[t]`` at position ``pos[t]`` (in the
        cache's type). The forward pass stores its rows inside the attention call
        (``attention.attend``); this is the same code, for tests and tools."""
        from .attention import store_rows  # numba: compiled or loaded on first use

        store_rows(self.k[layer], self.v[layer], np.asarray(slot, np.int64),
                   np.asarray(pos, np.int64), np.ascontiguousarray(k, dtype=np.float32),
                   np.ascontiguousarray(v, dtype=np.float32))


@dataclass
class _SlotState:
    """One slot's bookkeeping (``KVCache``'s): the ids of its positions (n_ctx, the first
    n cached), positions the recurrent state holds (< n: a replay is due), and its
    snapshots."""

    ids: np.ndarray
    n: int = 0
    state_n: int = 0
    checkpoints: list = field(default_factory=list)


class KVCache:
    """One sequence's cached positions: slot ``slot`` of ``arena``.

    ``n`` is the number of positions cached and ``ids`` their ids (the cache is their one
    owner: the engine reads them to reuse a prefix). A forward pass stores each layer's
    new keys and values at positions ``n..n+T`` and then ``advance``s by its T ids once all
    layers are done.

    With recurrent layers the cache also keeps snapshots of the state
    (``MAX_CHECKPOINTS``): ``truncate(n)`` returns to the last snapshot at or before n, and
    the ids from there to n are evaluated again before the next batch (``take_replay``,
    run by ``Model.forward_batch``), which gives the numbers of an uncut sequence
    (the recurrence does not depend on how a sequence is chunked). ``reusable`` says how
    much a truncation keeps without that replay (the engine evaluates the rest itself).
    """

    def __init__(self, arena: KVArena, slot: int) -> None:
        self.arena = arena
        self.slot = slot
        self._s = arena.states[slot]

    # the slot's bookkeeping, kept in the arena (``KVArena.slots``)
    n = property(lambda self: self._s.n, lambda self, v: setattr(self._s, "n", v))
    _state_n = property(lambda self: self._s.state_n,
                        lambda self, v: setattr(self._s, "state_n", v))
    _checkpoints = property(lambda self: self._s.checkpoints,
                            lambda self, v: setattr(self._s, "checkpoints", v))

    @property
    def ids(self) -> np.ndarray:
        """The ids of the cached positions, (n,) int32: a read-only view (``advance`` and
        ``truncate`` change them)."""
        view = self._s.ids[:self.n]
        view.flags.writeable = False
        return view

    @property
    def n_ctx(self) -> int:
        return self.arena.n_ctx

    @property
    def kv_type(self) -> str:
        return self.arena.kv_type

    @property
    def n_free(self) -> int:
        return self.n_ctx - self.n

    @property
    def nbytes(self) -> int:
        """Bytes of this sequence's share of the arena (all its positions)."""
        return self.arena.nbytes // self.arena.n_slots

    @property
    def rewinds(self) -> bool:
        """Whether ``truncate`` can cut back to any position at no cost (no recurrent
        state)."""
        return self.arena.recurrent is None

    def reusable(self, n: int) -> int:
        """How many of the first ``n`` cached positions a truncation keeps without
        evaluating any again: n, or with a recurrent state n when it is where the state
        is, else the last snapshot's position before n (0 when none)."""
        if self.rewinds or n == self._state_n:
            return n
        return max((p for p, _, _ in self._checkpoints if p <= n), default=0)

    def check_room(self, n_new: int) -> None:
        if n_new > self.n_free:
            raise ContextFullError(
                f"{n_new} more tokens do not fit: {self.n} of the context's {self.n_ctx} "
                f"positions are used")

    def advance(self, ids: np.ndarray) -> None:
        """Mark ``ids`` as cached at the next positions, after every layer has stored them
        (and the recurrent states are committed: then a snapshot may be taken)."""
        n_new = len(ids)
        self.check_room(n_new)
        if not self.rewinds and self._state_n != self.n:
            raise ValueError("a truncated recurrent cache evaluates its replay first")
        self._s.ids[self.n:self.n + n_new] = ids
        before = self.n
        self.n += n_new
        self._state_n = self.n
        if not self.rewinds and (n_new > 1 or before // CHECKPOINT_EVERY
                                 != self.n // CHECKPOINT_EVERY):
            conv, ssm = self.arena.state(self.slot)
            self._checkpoints.append((self.n, conv.copy(), ssm.copy()))
            del self._checkpoints[:-MAX_CHECKPOINTS]

    def truncate(self, n: int) -> None:
        """Forget every position from n on (e.g. to reuse a shared prompt prefix)."""
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot truncate a cache of {self.n} positions to {n}")
        if not self.rewinds:
            self._checkpoints = [c for c in self._checkpoints if c[0] <= n]
            at = self.reusable(n)
            if at != self._state_n and at:
                _, conv, ssm = next(c for c in self._checkpoints if c[0] == at)
                live_conv, live_ssm = self.arena.state(self.slot)
                live_conv[:] = conv
                live_ssm[:] = ssm
            self._state_n = at  # 0: the next batch starts from a zero state
        self.n = n

    @property
    def pending(self) -> bool:
        """Whether ids between the recurrent state and ``n`` wait to be evaluated again."""
        return not self.rewinds and self._state_n != self.n

    def take_replay(self) -> np.ndarray | None:
        """The ids between the recurrent state and ``n`` (to evaluate, without logits,
        before anything else), the cache set back to the state; None when there are none."""
        if not self.pending:
            return None
        ids = self._s.ids[self._state_n:self.n].copy()
        self.n = self._state_n
        return ids

    def clear(self) -> None:
        self.truncate(0)

    def __repr__(self) -> str:
        return (f"KVCache(slot {self.slot}, n={self.n}, n_ctx={self.n_ctx}, "
                f"{self.nbytes / 2**20:.1f} MiB)")
