"""The layers' one way to run: a planner over the layer specs and one executor.

``plan(blocks)`` looks at the typed specs once, at load, and decides each layer's parts
apart (``LayerPath``): its mixer runs fused (``fused.attention``; ``fused.delta_net``,
``fused.short_conv`` for a gated delta net or short convolution) or on the reference path
(Mamba2, latent attention, a mixer with a weight type without a compiled product), its FFN
fused (a dense one: ``fused.ffn``; experts, alone or beside a dense one: ``fused_experts``)
or on the reference path (experts the fused step does not take, ...), and what comes after
the FFN (a per-layer input and the output scale: ``fused.end_step``) fused, or op by op
where its products have no compiled kernel. From
these it builds what the compiled code needs (each layer's arguments for the fused layers,
``fused.LayerArgs``, and the team's tables, ``team.Stack``) or says why it cannot; ``run``
then takes, for every batch:

- the team (``team.run_stack``): every layer in one compiled call shared by the threads,
  for a few rows (decoding, short prompts), where every layer is compiled whole and alike;
- the fused layers (``fused.layer``): each layer's fused parts as one compiled call each
  (a recurrent mixer two, and one more per further sequence of the batch), the others as
  the reference path runs them, for longer batches (for every batch where the team cannot
  take the layers);
- the reference forward (``reference.stack``) when the plan says no part of the layers can
  be compiled, for the reason it gives (``Plan.describe``, shown by ``gguflm inspect`` and
  ``run --verbose``, which name each part's path: never silently); or, on a first run,
  while a background process compiles them (``Plan.defer``, ``background.py``): from the
  first batch after they are in the cache, the compiled layers.

All three compute the same numbers bit for bit (the same kernels, the same order per
element), so a sequence's logits do not depend on which one ran, nor on which path each
part took.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..gguf.types import GGMLType
from ..quant.kerneltypes import COMPILED_TYPES
from . import reference
from .layer import (
    Block,
    DeltaNet,
    DenseAndExperts,
    Experts,
    LatentAttention,
    Mamba2,
    ShortConv,
)


class Plan:
    """How a model's layers run. ``reason`` (not compiled, not even in part: why) and
    ``paths`` (each layer's parts' paths, ``LayerPath``) are decided at load from the specs
    alone; the compiled code's arguments (``tables``: each layer's for the fused layers,
    and the team's, None with ``team_reason`` where the team cannot take the layers) are
    built on the first forward pass, so that loading a model (``inspect``, a tokenizer
    user) never starts numba."""

    def __init__(self, blocks: list[Block] | None, reason: str = "", team_reason: str = "",
                 paths: list[LayerPath] | None = None) -> None:
        self._blocks = blocks if not reason else None
        self.reason = reason
        self.paths = [] if reason else paths if paths is not None else [
            LayerPath(None, None) for _ in blocks or ()]
        # some layer runs a part on the reference path beside the fused ones
        self.mixed = not all(p.compiled for p in self.paths)
        self.team_reason = team_reason
        self._tables: tuple[tuple[Any, ...], Any] | None = None
        self._lock = threading.Lock()
        self._pending: Any = None  # a background.Compiling while the layers compile
        self.gave_up = False  # that compilation ended without them: reference for good
        # (keys' table, queries' table) of the layers whose queries have their own RoPE
        # table: a batch where the two differ runs on the reference path (``run``)
        self.query_tables = tuple(sorted({(b.attn.rope, b.attn.q_rope) for b in blocks or ()
                                          if getattr(b.attn, "q_rope", None) is not None}))
        # the compiled steps the layers run besides the attention's and the dense FFN's
        # ("module.name" in gguflm.model): what a first run's compilation has to put in the
        # cache (``base.compiled``)
        self.steps = tuple(sorted({step for b, p in zip(blocks or (), self.paths, strict=False)
                                   for step in _steps(b, p)}))

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

                layers = tuple(fused.layer_args(b, p.mixer is None, p.ffn is None,
                                                not p.extras)
                               for b, p in zip(self._blocks, self.paths, strict=True))
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
        if self.mixed:
            fused, slow = _summary(self.paths)
            return (f"compiled per part (fused layers for every batch; no team: "
                    f"{self.team_reason}): fused: {fused}; reference (numpy, op by op): "
                    f"{slow}" + self._query_note())
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


@dataclass(frozen=True)
class Part:
    """A part of a layer on the reference path: ``text`` says what and why (of the first
    layer it is said of); layers whose parts share ``key`` are named together."""

    key: str
    text: str


# the key of an expert FFN the fused experts do not take (``_experts_refused``): op by op,
# each product compiled, as in a compiled model
EXPERTS = "experts"


@dataclass(frozen=True)
class LayerPath:
    """How one layer's parts run: the mixer and the FFN each fused (None: ``fused.attention``,
    ``fused.delta_net`` or ``fused.short_conv``, ``fused.ffn`` or ``fused_experts``) or on
    the reference path (the ``Part``); ``extras``: what runs after the FFN, op by op
    (``reference.layer_end``)."""

    mixer: Part | None
    ffn: Part | None
    extras: tuple[Part, ...] = ()
    mixer_name: str = "the attention"  # what the mixer is, in the plan (``MixerKind.name``)

    @property
    def fused(self) -> bool:
        """Whether a fused step runs in this layer."""
        return self.mixer is None or self.ffn is None

    @property
    def compiled(self) -> bool:
        """Whether the layer runs as a compiled model's: a fused attention, a fused FFN
        (dense or experts) or experts the fused step does not take (``EXPERTS``: op by op,
        each product compiled, which the plan's line names), nothing after them."""
        return (self.mixer is None and (self.ffn is None or self.ffn.key == EXPERTS)
                and not self.extras)


@dataclass(frozen=True)
class MixerKind:
    """A kind of mixer as the planner sees it: its name in the plan, what the team's
    refusal says of it, its product groups (by name, as its fused step runs them) and its
    compiled steps besides the attention's ("module.name" in gguflm.model)."""

    kind: type | None  # the layer spec's class (None: an attention)
    name: str
    team: str
    groups: tuple
    steps: tuple[str, ...] = ()


_ATTENTION = MixerKind(None, "the attention", "", _GROUPS[:2])
_MIXER_KINDS = (
    MixerKind(DeltaNet, "the gated delta net", "a recurrent mixer",
              (("qkv/z", lambda b: (b.attn.qkv, b.attn.z)),
               ("beta/alpha", lambda b: (b.attn.beta, b.attn.alpha)),
               ("output", lambda b: (b.attn.out,))),
              ("fused_recurrent.delta_in", "fused_recurrent.delta_last", "deltanet.sequence")),
    MixerKind(ShortConv, "the gated short convolution", "a recurrent mixer",
              (("in_proj", lambda b: (b.attn.in_proj,)), ("output", lambda b: (b.attn.out,))),
              ("fused_recurrent.short_in", "fused_recurrent.short_last",
               "shortconv.sequence")),
    MixerKind(Mamba2, "the Mamba2 state-space mixer", "a recurrent mixer",
              (("z/xBC/dt", lambda b: (b.attn.z, b.attn.xbc, b.attn.dt)),
               ("output", lambda b: (b.attn.out,))),
              ("fused_recurrent.mamba_in", "fused_recurrent.mamba_last", "mamba2.sequence")),
    MixerKind(LatentAttention, "the multi-head latent attention", "MLA",
              (("kv_a/q_a", lambda b: (b.attn.kv_a, b.attn.q_a)),
               ("q_b", lambda b: (b.attn.q_b,)), ("output", lambda b: (b.attn.o,))),
              ("fused_mla.mla_step",)))


def mixer_kind(b: Block) -> MixerKind:
    """Layer ``b``'s mixer's ``MixerKind``."""
    return next((k for k in _MIXER_KINDS if isinstance(b.attn, k.kind)), _ATTENTION)


def _slow_product(b: Block, groups: tuple, what: str) -> Part | None:
    """The ``Part`` of a product in ``groups`` whose weight type has no compiled product."""
    for role, lins in groups:
        for lin in lins(b):
            if lin is not None and lin.w.type not in COMPILED_TYPES:
                t = lin.w.type.ggml_name
                return Part(f"{what} {role} {t}", f"{what}: {lin.w.name} ({role}) is {t}, "
                            f"which has no compiled product (only a dequantizing one)")
    return None


def _mixer_path(b: Block) -> Part | None:
    """Why layer ``b``'s mixer runs on the reference path, or None: fused."""
    a, mk = b.attn, mixer_kind(b)
    heads = isinstance(a, LatentAttention) and (a.k_b_all.why or a.v_b_all.why)
    if heads:  # its per-head products one expert-products call each, or none
        text = (f"{mk.name} (MLA), whose per-head products k_b/v_b have no one-call "
                f"kernel ({heads}): its attention over the latent in numba, its products "
                f"op by op")
        return Part(f"{mk.name} heads", text)
    return _slow_product(b, mk.groups, mk.name)


def _experts_run(e: Experts) -> str:
    """How an expert FFN the fused experts do not take runs, op by op, why, and which of
    its weights dequantize."""
    slow = next((m for m in (*e.gate, *e.up, *e.down) if m.type not in COMPILED_TYPES), None)
    how = ("every chosen expert's gate and up in one kernel call, their downs in another"
           if e.gate_up_all.usable and e.down_all.usable else
           f"expert by expert ({e.gate_up_all.why or e.down_all.why})")
    return (f"a mixture of experts, run op by op ({_experts_refused(e)}, which the fused "
            f"experts do not take): the router, the top-k, then {how}" + (
                f"; {slow.name} is {slow.type.ggml_name}, whose products dequantize (no "
                f"compiled product yet)" if slow is not None else ""))


def _f16_experts(mats: tuple) -> bool:
    """Whether these expert matrices (per matrix, every expert's) are F16 weights the
    fused experts' float kernel takes: (rows, K) C-contiguous, all of one shape."""
    first = mats[0][0]
    return all(m.type == GGMLType.F16 and m.raw.dtype in (np.float16, np.uint16)
               and m.raw.ndim == 2 and m.raw.flags.c_contiguous and m.shape == first.shape
               for ms in mats for m in ms)


def _steps(b: Block, p: LayerPath) -> tuple[str, ...]:
    """The compiled steps layer ``b`` runs as ``p`` plans it, besides the attention's and
    the dense FFN's: a fused mixer's, the fused experts', the per-layer input's."""
    f = b.ffn
    moe = (_experts_steps(f) if isinstance(f, Experts) else ("dense_moe_step",)
           if isinstance(f, DenseAndExperts) else ()) if p.ffn is None else ()
    return ((mixer_kind(b).steps if p.mixer is None else ())
            + tuple(f"fused_experts.{s}" for s in moe)
            + (("fused.end_step",) if b.per_layer is not None and not p.extras else ()))


def _experts_steps(e: Experts) -> tuple[str, ...]:
    """The compiled steps (``fused_experts``) that fused experts ``e`` run: one, or two
    around a numpy step (``fused_experts.run``)."""
    return (("moe_front", "moe_back") if e.act == "swiglu_oai" else
            ("moe_route", "moe_experts") if e.gating == "sigmoid" else ("moe_step",))


def _calls(e: Experts) -> str:
    """The compiled calls fused experts ``e`` take, in words."""
    return ("one compiled call" if len(_experts_steps(e)) == 1 else
            f"two compiled calls around numpy's "
            f"{'clamped SwiGLU' if e.act == 'swiglu_oai' else 'sigmoid'}")


def _experts_refused(e: Experts) -> str:
    """Why the fused experts (``fused_experts``) do not take ``e``, or ''."""
    if e.act == "swiglu_oai" and e.gating == "sigmoid":
        return "a sigmoid gating beside the clamped SwiGLU (two numpy steps)"
    if e.router.w.type not in COMPILED_TYPES | {GGMLType.F32}:
        return f"the router {e.router.w.name} is {e.router.w.type.ggml_name}"
    for what, all_w, mats in (("gate and up", e.gate_up_all, (e.gate, e.up)),
                              ("down", e.down_all, (e.down,))):
        if not all_w.usable and not _f16_experts(mats):
            return f"the experts' {what}: {all_w.why}"
    if e.shared is not None:
        slow = next((lin.w for lin in (e.shared.gate, e.shared.up, e.shared.down)
                     if lin.w.type not in COMPILED_TYPES), None)
        if slow is not None:
            return f"the shared expert's {slow.name} is {slow.type.ggml_name}"
    return ""


# the dense FFN's product groups beside experts (``DenseAndExperts``)
_DENSE_GROUPS = (("FFN gate/up", lambda b: (b.ffn.dense.gate, b.ffn.dense.up)),
                 ("FFN down", lambda b: (b.ffn.dense.down,)))


def _dense_experts_refused(b: Block) -> str:
    """Why the fused dense-beside-experts step (``fused_experts.dense_moe_step``: the
    experts in one call, ``moe_step``) does not take layer ``b``'s FFN, or ''."""
    e = b.ffn.experts
    why = (_experts_refused(e) or (
        "experts in more than one compiled call" if len(_experts_steps(e)) > 1 else
        "a gated shared expert" if e.shared_gate is not None else ""))
    if why:
        return f"its experts: {why}"
    slow = _slow_product(b, _DENSE_GROUPS, "its dense FFN")
    return "" if slow is None else slow.text


def _ffn_path(b: Block) -> Part | None:
    """Why layer ``b``'s FFN runs on the reference path (``reference.ffn_part``), or None:
    fused (a dense FFN: ``fused.ffn``; experts: ``fused_experts``, beside a dense FFN
    ``fused_experts.dense_moe_step``)."""
    f = b.ffn
    if isinstance(f, DenseAndExperts):
        why = _dense_experts_refused(b)
        text = f"the FFN, a dense FFN beside experts, op by op: the fused step does not take {why}"
        return Part(text, text) if why else None
    if isinstance(f, Experts):
        return Part(EXPERTS, f"the FFN, {_experts_run(f)}") if _experts_refused(f) else None
    return _slow_product(b, _GROUPS[2:], "the FFN")


def _extras(b: Block) -> tuple[Part, ...]:
    """What layer ``b`` runs after its FFN op by op: a per-layer input whose products
    have no compiled kernel (otherwise ``fused.end_step``, with the output scale; an
    output scale alone is one multiply either way)."""
    p = b.per_layer
    slow = p is not None and next((lin for lin in (p.gate, p.proj)
                                   if lin.w.type not in COMPILED_TYPES), None)
    if not slow:
        return ()
    t = slow.w.type.ggml_name
    text = (f"the per-layer embedding input: {slow.w.name} is {t}, which has no compiled "
            f"product (only a dequantizing one)")
    return (Part(f"per-layer input {t}", text),)


def _paths(blocks: list[Block]) -> list[LayerPath]:
    """Each layer's parts' paths."""
    return [LayerPath(_mixer_path(b), _ffn_path(b), _extras(b), mixer_kind(b).name)
            for b in blocks]


def _layers(ils: list[int]) -> str:
    """Layer indices, ascending, as ranges: "layers 0-2, 4-6", "layer 3"."""
    runs: list[list[int]] = []
    for il in ils:
        if runs and il == runs[-1][1] + 1:
            runs[-1][1] = il
        else:
            runs.append([il, il])
    spans = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"layer{'s' if len(ils) > 1 else ''} {spans}"


def _summary(paths: list[LayerPath]) -> tuple[str, str]:
    """(the fused parts and their layers, the reference path's parts and their layers)."""
    fused = [(what, [il for il, p in enumerate(paths) if getattr(p, part) is None
                     and (part == "ffn" or p.mixer_name == what)])
             for what, part in (*((k.name, "mixer") for k in (_ATTENTION, *_MIXER_KINDS)),
                                ("the FFN", "ffn"))]
    found = sorted(((rank, il, part) for il, p in enumerate(paths)  # mixers, FFNs, extras
                    for rank, part in enumerate((p.mixer, p.ffn, *p.extras))
                    if part is not None), key=lambda f: f[:2])
    slow: dict[str, tuple[str, list[int]]] = {}
    for _, il, part in found:
        slow.setdefault(part.key, (part.text, []))[1].append(il)
    return (", ".join(f"{what} in {_layers(ils)}" for what, ils in fused if ils),
            "; ".join(f"in {_layers(ils)}, {text}" for text, ils in slow.values()))


def _not_compilable(blocks: list[Block], paths: list[LayerPath]) -> str:
    """Why these layers cannot run compiled, not even in part, or ''."""
    if not blocks:
        return "the model has no layers"
    if any(p.fused for p in paths):
        return ""
    return "no part of any layer has a fused step: " + _summary(paths)[1]


def _team_lacks(b: Block) -> str:
    """What of layer ``b``'s the team's attention or FFN does not take (the fused steps
    do: a recurrent mixer, ...), or ''."""
    a, mk = b.attn, mixer_kind(b)
    if mk is not _ATTENTION:
        return f"{mk.name} ({mk.team})"
    return ", ".join(name for name, present in (
        ("values RMS-normed", a.v_norm is not None),
        ("keys and values shared from an earlier layer", a.kv_layer is not None),
        ("V = K's product (no attn_v)", a.kv_layer is None and a.v is a.k),
        ("an output gate (joint Q+gate rows)", a.q_gate),
        ("GELU through ggml's float16 table",
         getattr(getattr(b.ffn, "dense", b.ffn), "act", "") == "gelu_f16"),
        ("a dense FFN beside a mixture of experts (fused: the dense FFN, the router, the "
         "top-k and the chosen experts in one compiled call)", isinstance(b.ffn, DenseAndExperts)),
        ("a per-layer embedding input", b.per_layer is not None),
        ("an output scale", b.out_scale != 1.0))
        if present)


def _team_refuses(e: Experts) -> str:
    """What of the fused experts ``e`` the team's (``team_experts``) do not take, or ''."""
    return ", ".join(name for name, present in (
        ("a normed router input", e.router_in_norm is not None),
        ("a sigmoid gating", e.gating == "sigmoid"),
        ("the clamped SwiGLU", e.act == "swiglu_oai"),
        ("a shared expert", e.shared is not None),
        ("biases", any(v is not None for v in (e.gate_b, e.up_b, e.down_b, e.down_scale))),
        (f"a {e.router.w.type.ggml_name} router", e.router.w.type != GGMLType.F32),
        ("float experts", not (e.gate_up_all.usable and e.down_all.usable)))
        if present)


def _team_differs(blocks: list[Block]) -> str:
    """Why the team (one table for every layer) cannot take these layers, or ''."""
    for il, b in enumerate(blocks):
        if lacks := _team_lacks(b):
            return f"layer {il} has {lacks}, which the team does not take"
        if b.residual_scale != 1.0:
            return (f"layer {il} scales its branches before the residual adds (Granite's "
                    f"residual_scale), which the team does not take")
        if isinstance(b.ffn, Experts) and _experts_refused(b.ffn):
            return f"layer {il}'s FFN is {_experts_run(b.ffn)}"
        if isinstance(b.ffn, Experts) and (why := _team_refuses(b.ffn)):
            return (f"layer {il}'s FFN is a mixture of experts (fused: the router, the "
                    f"top-k and the chosen experts in {_calls(b.ffn)}) with {why}, which "
                    f"the team does not take")

    def shape(b: Block) -> tuple:
        a, f = b.attn, b.ffn
        ffn = ((f.gate_up_all.rows, f.down_all.rows, len(f.gate), f.n_used, f.gating,
                f.groups, f.groups_used, f.norm_weights, f.scale)
               if isinstance(f, Experts) else tuple(lin.w.shape for lin in (f.gate, f.up,
                                                                             f.down)))
        return (tuple(lin.w.shape for lin in (a.q, a.k, a.v, a.o)), ffn, a.n_head,
                a.n_head_kv, a.head_dim, a.head_dim_v, a.neox, a.scale, a.softcap, f.act,
                b.eps)
    first = shape(blocks[0])
    for il, b in enumerate(blocks):
        if shape(b) != first:
            return (f"layer {il} differs from layer 0 in its shapes, RoPE pairing, scale, "
                    f"soft-cap, activation, eps or experts")
    return ""


# why a model whose attention.causal is false runs on the reference path
BIDIRECTIONAL = ("its attention is bidirectional (attention.causal = false: an embedding "
                 "model), which the compiled layers, causal, do not take; the reference "
                 "path attends over each whole sequence")


def plan(blocks: list[Block], causal: bool = True) -> Plan:
    """The plan for these layers (see the module docstring); ``causal`` False: attention
    within each whole sequence, which only the reference path computes."""
    paths = _paths(blocks) if causal else []
    why = ("" if causal else BIDIRECTIONAL) or _not_compilable(blocks, paths)
    team_why = ("" if why else "some parts run on the reference path"
                if not all(p.compiled for p in paths) else _team_differs(blocks))
    return Plan(blocks, why, team_why, paths)


def run(p: Plan, blocks: list[Block], x: np.ndarray, batch: Any,
        ropes: tuple[np.ndarray, ...], rows: np.ndarray | None = None,
        inputs: np.ndarray | None = None) -> np.ndarray:
    """Every layer over x (T, n_embd) -> (T', n_embd), as ``p`` says; ``ropes`` the RoPE
    tables the layers' ``attn.rope`` index; only ``rows`` leave the last layer; ``inputs``
    (T, n_layer, d) the per-layer inputs of the layers that take one."""
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
        inp = None if b.per_layer is None else inputs[:, b.per_layer.index]
        x = fused.layer(x, b, la, batch, il, ropes, rows if il == last else None, inp)
        reference.between_layers(batch, il, last)
    return x
