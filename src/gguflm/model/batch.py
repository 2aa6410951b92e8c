"""A forward batch: tokens of one or more sequences evaluated together, each at its own
positions with its own KV cache (llama.cpp's ``llama_batch`` with ``seq_id`` and ``pos``).

Norms, projections and FFNs run once over all rows; RoPE takes each row's position, and
attention (``Batch.attention``) each row's own sequence. Every per-row computation is
batch-invariant, so a sequence's logits do not depend on what else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .kv_cache import KVCache

if TYPE_CHECKING:
    from .forward_pass import Pass, Stops

# What a sequence wants back from a batch, of logits and of final hidden states: those of
# its last row, of every row, or none
LAST, ALL, NONE = "last", "all", "none"


@dataclass
class Part:
    """One sequence's share of a batch: ``ids`` evaluated at positions cache.n.. .

    ``logits`` says which rows' logits it wants; ``hidden`` which rows' final hidden states
    (the output norm's result, before the output projection: what embeddings pool), which
    the forward pass leaves in ``hidden_states`` (rows, n_embd). ``flash``: its rows
    attend as llama.cpp's flash attention computes (``attention.attend``)."""

    cache: KVCache
    ids: np.ndarray
    logits: str = LAST
    hidden: str = NONE
    hidden_states: np.ndarray | None = field(default=None, repr=False)
    flash: bool = False


def _rows(want: str, row: int, n: int) -> np.ndarray:
    if want == ALL:
        return np.arange(row, row + n)
    if want == LAST:
        return np.array([row + n - 1])
    return np.zeros(0, np.int64)


@dataclass
class Pause:
    """A caller's way to run a pass through its stops with one callback (``Model.
    forward_batch(parts, pause)``; the engine drives ``forward_steps`` itself): while
    ``flag[0]`` is nonzero the pass is asked to stop at each of its stops (between two
    layers, before the output product, between the halves of a big one) and ``run()`` is
    called there. ``run`` may evaluate other sequences of the arena, not the paused
    batch's."""

    run: Callable[[], None]
    flag: np.ndarray = field(default_factory=lambda: np.zeros(2, np.int64))

    def drive(self, steps: Pass) -> np.ndarray:
        """Run ``steps`` to its end, ``run()`` at each stop asked; its logits."""
        if self.flag[0]:
            steps.stop()
        for _ in steps:
            self.run()
            if self.flag[0]:
                steps.stop()
        return steps.logits


class Batch:
    """Rows of several sequences. ``ids``, ``pos`` and ``slot`` are (T,); ``out`` holds the
    rows that go through the last layer (their logits or hidden states are wanted), in row
    order; ``logit_rows`` indexes the rows of ``out`` whose logits are wanted (None: all of
    them); ``parts`` the sequences, in row order."""

    def __init__(self, parts: Sequence[Part]) -> None:
        if not parts:
            raise ValueError("a batch needs at least one sequence")
        arena = parts[0].cache.arena
        if any(p.cache.arena is not arena for p in parts):
            raise ValueError("the sequences of a batch must share one KV arena")
        if len({p.cache.slot for p in parts}) != len(parts):
            raise ValueError("a sequence may appear only once in a batch")
        self.arena = arena
        self.parts = list(parts)
        # where the pass may stop (``Model.forward_steps``; None: it runs through)
        self.stops: Stops | None = None
        # the recurrent layers that wrote each slot's new state, made live by advance
        self._staged: dict[int, set[int]] = {}
        ids, pos, slot, out, logit_rows, flash = [], [], [], [], [], []
        self.hidden_rows: list[tuple[Part, np.ndarray]] = []  # (part, its rows of ``out``)
        row = n_out = 0
        for p in parts:
            n = len(p.ids)
            if n == 0:
                raise ValueError("every sequence in a batch needs at least one token")
            p.cache.check_room(n)
            if p.cache.pending:
                raise ValueError("a truncated recurrent cache evaluates its replay first "
                                 "(Model.forward_batch)")
            ids.append(p.ids)
            pos.append(np.arange(p.cache.n, p.cache.n + n))
            slot.append(np.full(n, p.cache.slot))
            flash.append(np.full(n, p.flash))
            # the rows this part needs past the last layer: logits' and hidden states' union
            wants = {p.logits, p.hidden}
            rows = _rows(ALL if ALL in wants else LAST if LAST in wants else NONE, row, n)
            out.append(rows)
            logit_rows.append(n_out + np.searchsorted(rows, _rows(p.logits, row, n)))
            if p.hidden != NONE:
                self.hidden_rows.append((p, n_out + np.searchsorted(rows, _rows(p.hidden,
                                                                              row, n))))
            row += n
            n_out += len(rows)
        self.ids = np.concatenate(ids).astype(np.int64, copy=False)
        self.pos = np.concatenate(pos).astype(np.int64)
        self.slot = np.concatenate(slot).astype(np.int64)
        self.flash = np.concatenate(flash).astype(np.bool_)
        self.span = int(self.pos.max()) + 1  # the longest sequence's positions so far
        self.out = np.concatenate(out).astype(np.int64)
        lr = np.concatenate(logit_rows).astype(np.int64)
        self.logit_rows = None if len(lr) == n_out else lr

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def n_ctx(self) -> int:
        """The context size of the batch's sequences (one arena: all the same)."""
        return self.arena.n_ctx

    def attention(self, il: int, q: np.ndarray, k: np.ndarray | None, v: np.ndarray | None,
                  scale: float, cap: float = 0.0, window: int = 0,
                  sinks: np.ndarray | None = None) -> np.ndarray:
        """llama.cpp's build_attn less the output projection: store this batch's k
        (T, H_kv, d) and v (T, H_kv, d_v) in layer ``il`` of each row's cache, then attend
        with q (T, H, d) over each row's own sequence -> (T, H * d_v). Causal; with a
        sliding ``window`` > 0 a query sees itself and the window - 1 positions before it;
        ``cap`` > 0 soft-caps the scores; ``sinks`` (H,): each head's attention sink.
        Without k and v (a layer sharing layer ``il``'s keys and values) nothing is
        stored: layer ``il`` stored this batch's already."""
        from .attention import attend  # numba: compiled or loaded on first use

        arena = self.arena
        q = np.ascontiguousarray(q, dtype=np.float32)
        out = np.empty((len(q), q.shape[1], arena.head_dims_v[il]), np.float32)
        if k is not None:
            k = np.ascontiguousarray(k, dtype=np.float32)
            v = np.ascontiguousarray(v, dtype=np.float32)
        attend(q, arena.k[il], arena.v[il], self.slot, self.pos, int(window),  # stores k, v
               np.float32(scale), np.float32(cap), arena.f16, out, self.flash, k, v, sinks)
        return out.reshape(len(q), -1)

    def sequences(self) -> list[tuple[Part, slice]]:
        """Each part with its rows of the batch (consecutive, in part order)."""
        out, row = [], 0
        for p in self.parts:
            out.append((p, slice(row, row + len(p.ids))))
            row += len(p.ids)
        return out

    def recurrent_state(self, layer: int, part: Part) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray, np.ndarray]:
        """Recurrent layer ``layer``'s state for ``part``'s sequence: (conv (conv_rows,
        conv_dim), ssm (n_head, head_dim, head_dim)) to read, zeros for a sequence that
        starts here (position 0), and (conv, ssm) to write the new state into (the slot's
        spare copy: ``stage_state``, then ``advance`` makes it the live one)."""
        s = part.cache.slot
        conv, ssm = (a[layer] for a in self.arena.state(s))
        new_conv, new_ssm = (a[layer] for a in self.arena.state(s, spare=True))
        if part.cache.n == 0:
            conv, ssm = np.zeros_like(conv), np.zeros_like(ssm)
        return conv, ssm, new_conv, new_ssm

    def stage_state(self, layer: int, part: Part) -> None:
        """Recurrent layer ``layer`` has written ``part``'s new state (the spare copy);
        ``advance`` makes it live once every recurrent layer has."""
        self._staged.setdefault(part.cache.slot, set()).add(layer)

    def advance(self) -> None:
        """Commit the recurrent states and mark every sequence's rows as cached (after the
        whole forward pass)."""
        r = self.arena.recurrent
        for slot, layers in self._staged.items():
            if len(layers) != r.n_layer:
                raise RuntimeError(f"{len(layers)} of {r.n_layer} recurrent layers ran")
            self.arena.live[slot] ^= 1
        self._staged.clear()
        for p in self.parts:
            p.cache.advance(p.ids)
