"""The layers' one way to run: a planner over the layer specs and one executor.

``plan(blocks)`` looks at the typed specs once, at load, and either builds what the
compiled code needs (each layer's arguments for the fused layers, ``fused.LayerArgs``, and the
team's tables, ``team.Stack``) or says why it cannot; ``run`` then takes, for every batch:

- the team (``team.run_stack``): every layer in one compiled call shared by the threads,
  for a few rows (decoding, short prompts);
- the fused layers (``fused.layer``): each layer's attention and FFN as one compiled call each,
  for longer batches;
- the reference forward (``reference.stack``) when the plan says the layers cannot be
  compiled, for the reason it gives (``Plan.describe``, shown by ``gguflm inspect`` and
  ``run --verbose``): never silently; or, on a first run, while a background process
  compiles them (``Plan.defer``, ``background.py``): from the first batch after they are
  in the cache, the compiled layers.

All three compute the same numbers bit for bit (the same kernels, the same order per
element), so a sequence's logits do not depend on which one ran.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..quant.kerneltypes import COMPILED_TYPES
from . import reference
from .layer import (
    Attention,
    Block,
    DeltaNet,
    DenseAndExperts,
    Experts,
    LatentAttention,
    Mamba2,
    ShortConv,
)


class Plan:
    """How a model's layers run. ``reason`` (not compiled: why) is decided at load from the
    specs alone; the compiled code's arguments (``tables``: each layer's for the fused layers,
    and the team's, None with ``team_reason`` where the team cannot take the layers) are
    built on the first forward pass, so that loading a model (``inspect``, a tokenizer
    user) never starts numba."""

    def __init__(self, blocks: list[Block] | None, reason: str = "", team_reason: str = ""
                 ) -> None:
        self._blocks = blocks if not reason else None
        self.reason = reason
        self.team_reason = team_reason
        self._tables: tuple[tuple[Any, ...], Any] | None = None
        self._lock = threading.Lock()
        self._pending: Any = None  # a background.Compiling while the layers compile
        self.gave_up = False  # that compilation ended without them: reference for good
        # (keys' table, queries' table) of the layers whose queries have their own RoPE
        # table: a batch where the two differ runs on the reference path (``run``)
        self.query_tables = tuple(sorted({(b.attn.rope, b.attn.q_rope) for b in blocks or ()
                                          if getattr(b.attn, "q_rope", None) is not None}))

    def defer(self, pending: Any) -> None:
        """Run on the reference path until ``pending`` (a ``background.Compiling``) has the
        compiled layers in the cache."""
        self._pending = pending

    def waiting(self) -> bool:
        """Whether this batch runs on the reference path because the compiled layers are
        still being compiled elsewhere (switching to them once they are ready)."""
        if self._pending is None:
            return False
        if self.gave_up:
            return True
        ready = self._pending.ready()
        if ready:
            self._pending = None
            return False
        self.gave_up = ready is False
        return True

    @property
    def compiled(self) -> bool:
        return not self.reason

    def tables(self) -> tuple[tuple[Any, ...], Any]:
        """(each layer's ``fused.LayerArgs``, the ``team.Stack`` or None), built once."""
        if self._tables is not None:  # every forward asks: no lock once built
            return self._tables
        with self._lock:
            if self._tables is None:
                from . import (
                    fused,  # numba: compiled or loaded now
                    team,
                )

                layers = tuple(fused.layer_args(b) for b in self._blocks)
                stack = None if self.team_reason else team.Stack(self._blocks)
                self._tables = (layers, stack)
            return self._tables

    def describe(self) -> str:
        """One line: the path the layers take and why."""
        if not self.compiled:
            return f"reference (numpy, op by op): {self.reason}"
        if self._pending is not None:
            where = "" if self._pending.pid is None else f" (pid {self._pending.pid})"
            why = ("the background compilation ended without them" if self.gave_up else
                   f"until the compiled layers, being compiled in the background{where}, "
                   "are ready")
            return f"reference (numpy, op by op) {why}"
        if self.team_reason:
            return (f"compiled (fused layers for every batch; no team: {self.team_reason})"
                    + self._query_note())
        return ("compiled (team for decoding and short prompts, fused layers for longer batches)"
                + self._query_note())

    def _query_note(self) -> str:
        return ("; a batch whose queries' RoPE table differs from the keys' (an attention "
                "temperature other than 1) runs on the reference path"
                if self.query_tables else "")


# the product groups a layer shares calls over, by name, as the executor runs them
_GROUPS = (("Q/K/V", lambda b: (b.attn.q, b.attn.k, b.attn.v)),
           ("attention output", lambda b: (b.attn.o,)),
           ("FFN gate/up", lambda b: (b.ffn.gate, b.ffn.up)),
           ("FFN down", lambda b: (b.ffn.down,)))


def _uncompiled_parts(b: Block) -> list[str]:
    """The parts of layer spec ``b`` that the compiled layers do not take yet."""
    a = b.attn
    parts = [name for name, present in (
        ("values RMS-normed", a.v_norm is not None),
        (f"keys and values shared from layer {a.kv_layer}", a.kv_layer is not None),
        ("V = K's product (no attn_v)", a.kv_layer is None and a.v is a.k),
        ("a dense FFN beside experts", isinstance(b.ffn, DenseAndExperts)),
        ("a per-layer embedding input", b.per_layer is not None),
        ("an output scale", b.out_scale != 1.0)) if present]
    if isinstance(b.ffn, Experts) and (b.ffn.router_in_norm is not None
                                       or b.ffn.down_scale is not None):
        parts.append("a normed router input or scaled experts")
    ffns = (b.ffn.dense, b.ffn.experts) if isinstance(b.ffn, DenseAndExperts) else (b.ffn,)
    if any(f.act == "gelu_f16" for f in ffns):
        parts.append("GELU through ggml's float16 table")
    return parts


def _not_compilable(blocks: list[Block]) -> str:
    """Why these layers cannot run compiled, or ''."""
    if not blocks:
        return "the model has no layers"
    for il, b in enumerate(blocks):
        parts = _uncompiled_parts(b) if isinstance(b.attn, Attention) else []
        if parts:
            return (f"layer {il} has what the compiled layers do not take yet: "
                    f"{', '.join(parts)}")
        if isinstance(b.attn, DeltaNet):
            return (f"layer {il} is a gated delta net (a recurrent layer), which has no "
                    f"compiled executor yet: its convolution and delta rule run per "
                    f"sequence in numba, its products op by op")
        if isinstance(b.attn, ShortConv):
            return (f"layer {il} is a gated short convolution (a recurrent layer), which "
                    f"has no compiled executor yet: its convolution runs per sequence in "
                    f"numba, its products op by op")
        if isinstance(b.attn, Mamba2):
            return (f"layer {il} is a Mamba2 state-space mixer (a recurrent layer), which "
                    f"has no compiled executor yet: its convolution and scan run per "
                    f"sequence in numba, its products op by op")
        if isinstance(b.attn, LatentAttention):
            return (f"layer {il} is multi-head latent attention (MLA: the cache holds each "
                    f"position's compressed latent), which has no compiled executor yet: "
                    f"its attention runs over the latent in numba, its products op by op")
        if b.attn.q_gate:
            return (f"layer {il}'s attention has an output gate (joint Q+gate rows), "
                    f"which the compiled layers do not take yet")
    for b in blocks:
        for role, lins in _GROUPS[:2] if isinstance(b.ffn, Experts) else _GROUPS:
            for lin in lins(b):
                if lin.w.type not in COMPILED_TYPES:
                    return (f"{lin.w.name} ({role}) is {lin.w.type.ggml_name}, which has no "
                            f"compiled product (only a dequantizing one)")
    return ""


def _team_differs(blocks: list[Block]) -> str:
    """Why the team (one table for every layer) cannot take these layers, or ''."""
    for il, b in enumerate(blocks):
        if b.residual_scale != 1.0:
            return (f"layer {il} scales its branches before the residual adds (Granite's "
                    f"residual_scale), which the team does not take")
        if isinstance(b.ffn, Experts):
            e = b.ffn
            slow = next((m for m in (*e.gate, *e.up, *e.down)
                         if m.type not in COMPILED_TYPES), None)
            how = ("every chosen expert's gate and up in one kernel call, their downs in "
                   "another" if e.gate_up_all.usable and e.down_all.usable else
                   f"expert by expert ({e.gate_up_all.why or e.down_all.why})")
            return (f"layer {il}'s FFN is a mixture of experts, run op by op: the router, "
                    f"the top-k, then {how}" + (
                        f"; {slow.name} is {slow.type.ggml_name}, whose products dequantize "
                        f"(no compiled product yet)" if slow is not None else ""))
    def shape(b: Block) -> tuple:
        a, f = b.attn, b.ffn
        return (tuple(lin.w.shape for lin in (a.q, a.k, a.v, a.o, f.gate, f.up, f.down)),
                a.n_head, a.n_head_kv, a.head_dim, a.head_dim_v, a.neox, a.scale,
                a.softcap, f.act, b.eps)
    first = shape(blocks[0])
    for il, b in enumerate(blocks):
        if shape(b) != first:
            return (f"layer {il} differs from layer 0 in its shapes, RoPE pairing, scale, "
                    f"soft-cap, activation or eps")
    return ""


# why a model whose attention.causal is false runs on the reference path
BIDIRECTIONAL = ("its attention is bidirectional (attention.causal = false: an embedding "
                 "model), which the compiled layers, causal, do not take; the reference "
                 "path attends over each whole sequence")


def plan(blocks: list[Block], causal: bool = True) -> Plan:
    """The plan for these layers (see the module docstring); ``causal`` False: attention
    within each whole sequence, which only the reference path computes."""
    why = ("" if causal else BIDIRECTIONAL) or _not_compilable(blocks)
    return Plan(blocks, why, "" if why else _team_differs(blocks))


def run(p: Plan, blocks: list[Block], x: np.ndarray, batch: Any,
        ropes: tuple[np.ndarray, ...], rows: np.ndarray | None = None,
        inputs: np.ndarray | None = None) -> np.ndarray:
    """Every layer over x (T, n_embd) -> (T', n_embd), as ``p`` says; ``ropes`` the RoPE
    tables the layers' ``attn.rope`` index; only ``rows`` leave the last layer; ``inputs``
    the per-layer inputs (only layers on the reference path take them: the plan says)."""
    if not p.compiled or p.waiting() or any(ropes[k] is not ropes[q]
                                            for k, q in p.query_tables):
        return reference.stack(x, blocks, batch, ropes, rows, inputs)
    from . import fused, team

    layers, stack = p.tables()
    if stack is not None:
        out = team.run_stack(stack, x, batch, ropes)
        if out is not None:  # every row through the last layer: the wanted rows' numbers
            return out if rows is None else out[rows]  # do not depend on the others
    last = len(blocks) - 1
    for il, (b, la) in enumerate(zip(blocks, layers, strict=True)):
        x = fused.layer(x, b, la, batch, il, ropes[b.attn.rope], rows if il == last else None)
        reference.between_layers(batch, il, last)
    return x
