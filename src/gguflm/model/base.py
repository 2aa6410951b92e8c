"""The Model interface every architecture implements, and what they all share.

An architecture subclasses ``Model`` and provides, in its own file: ``config_class`` (a
``ModelConfig`` subclass when it reads extra keys), ``load_tensors`` (declares its tensors
and their shapes, and builds ``blocks``: one typed layer spec per layer, ``layer.Block``),
``_forward`` (one batch through the network up to the final norm, the layers through
``run_layers``), ``head`` (the output projection) and ``rope_style`` (how RoPE pairs a
head's dimensions). The layers' plan (``executor.plan``: compiled, or why not) is made
once here, after ``load_tensors``.
This class does the rest: checking ids, splitting long batches, advancing the caches, and
handing out the final hidden states (for embeddings) and the logits each sequence asked for.
A batch may hold several sequences (``forward_batch``); ``forward`` is the one-sequence case;
``forward_steps`` is a batch's pass that its caller (the engine) runs a stretch at a time.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..gguf.reader import GGUFFile
from . import bidirectional, executor, ops
from .batch import ALL, LAST, NONE, Batch, Part, Pause
from .config import ModelConfig
from .forward_pass import HEAD, Pass, Stops, output_product
from .kv_cache import KVArena, KVCache, KVShape, check_kv_type
from .layer import Attention, Block, LatentAttention, Linear, experts, glu, qkv
from .weights import Layer, Weights

# Tokens per pass through the layers (``forward``): a longer prompt runs in passes of this
# many rows, each appending to the cache. The live intermediates of a pass grow with its
# rows (a 1B model's FFN holds three (rows, 8192) float32 arrays: 50 MB at 512 rows), and
# at 128 rows they stay within the L3 cache and the peak RSS within file + KV + 200 MiB.
MAX_BATCH = 128

ROPE_STYLES = ops.ROPE_STYLES  # RoPE pairings by name


class Model:
    """A loaded model: ``forward`` turns token ids into logits, caching keys and values.

    ``kv_type`` (``kv_cache.KV_TYPES``), the number type of the caches ``new_arena`` makes:
    "f16" (default) rounds keys and values to float16, and attention its other operands, as
    llama.cpp's default F16 cache does, which brings the logits closer to llama.cpp's;
    "f32" keeps attention in float32 (exact comparisons between evaluation orders, since
    float16 rounding magnifies last-bit differences into ~1e-3); "q8_0" stores them as ggml
    Q8_0 blocks (about half f16's memory; llama.cpp's ``-ctk/-ctv q8_0``).
    """

    config_class: type[ModelConfig] = ModelConfig
    blocks: list[Block] = []  # the layers' specs (``load_tensors``)
    # an architecture that runs its own forward instead of layer specs says what runs it
    forward_path: str | None = None
    plan: executor.Plan      # how they run (``from_gguf``)
    kv_type: str = "f16"
    # how the architecture pairs dimensions for RoPE; an instance may override it (a file
    # converted for the other pairing: ``load_model(..., rope_style=...)``)
    rope_style: str = "norm"
    # an encoder (bert) computes embeddings only, with ``embed_batch(id lists)``; it has no
    # logits, and the generation routes refuse it. So does any model whose file says
    # attention.causal = false (``from_gguf``: bidirectional.py)
    is_encoder: bool = False
    # a reranker's scoring head (pooling_type rank: ``classifier.py``), loaded by the
    # architectures llama.cpp gives one (bert, qwen3); None elsewhere
    classifier: Any = None

    def __init__(self, gguf: GGUFFile, config: ModelConfig) -> None:
        self.gguf = gguf
        self.config = config

    @classmethod
    def from_gguf(cls, gguf: GGUFFile, rope_style: str | None = None) -> Model:
        """Read the config, load and check every tensor (errors name the key or tensor),
        and plan how the layers run. ``rope_style`` replaces the architecture's RoPE
        pairing (``load_model``)."""
        embd = gguf.tensors.get("token_embd.weight")
        fallback = embd.np_shape[0] if embd is not None and len(embd.shape) == 2 else 0
        config = cls.config_class.from_metadata(gguf.metadata, n_vocab_fallback=fallback)
        model = cls(gguf, config)
        if rope_style is not None:
            model.rope_style = rope_style
        weights = Weights(gguf, config.arch)
        model.load_tensors(weights)
        weights.check_all_used()
        if not config.causal and not model.is_encoder:
            bidirectional.check_layers(model.blocks, config.arch)
            model.is_encoder = True  # embeddings only: no next-token logits
        model.plan = (executor.plan(model.blocks, config.causal) if model.blocks
                      else executor.Plan(None, model.forward_path or "no layer specs"))
        return model

    # -- what an architecture provides ----------------------------------------------------------
    def load_tensors(self, w: Weights) -> None:
        """Fetch every tensor from ``w`` with its declared shape, as attributes."""
        raise NotImplementedError

    def _forward(self, batch: Batch) -> np.ndarray:
        """Evaluate ``batch`` (its rows' ids at their positions), storing each layer's
        keys/values through ``batch.attention`` (the caches are advanced afterwards by the
        caller); return the final normed hidden states (len(batch.out), n_embd) of the rows
        ``batch.out`` lists."""
        raise NotImplementedError

    def dense_block(self, layer: Layer, act: str, *, attn_post_norm: np.ndarray | None = None,
                    ffn_post_norm: np.ndarray | None = None, **attn: object) -> Block:
        """The spec of a pre-norm layer (``attn_norm``, Q/K/V fused or not, ``attn_output``,
        ``ffn_norm``, a GLU FFN with gate and up fused or not, biases where the file has
        them, or where the layer has a router an expert FFN (``Weights.experts``, softmax
        routing, renormalised); post norms when given), from the config's head
        counts and sizes and this model's RoPE pairing; ``attn`` sets or overrides
        ``Attention`` fields (scale: 1/sqrt(head_dim))."""
        c = self.config
        q, k, v = qkv(layer, c.n_embd_q, c.n_embd_k, c.n_embd_v)
        fields = {"scale": 1.0 / float(np.sqrt(c.head_dim)), "neox": self.rope_style == "neox",
                  **attn}
        return Block(layer.attn_norm,
                     Attention(q, k, v, Linear.of(layer, "attn_output"), c.n_head, c.n_head_kv,
                               c.head_dim, c.head_dim_v, **fields),
                     layer.ffn_norm,
                     experts(layer, c.n_expert_used, act) if hasattr(layer, "ffn_gate_inp")
                     else glu(layer, act),
                     c.norm_eps, attn_post_norm, ffn_post_norm)

    def run_layers(self, x: np.ndarray, batch: Batch, ropes: tuple[np.ndarray, ...],
                   inputs: np.ndarray | None = None) -> np.ndarray:
        """Every layer over x (T, n_embd) as the plan says; only the rows ``batch.out``
        lists leave the last layer -> (len(batch.out), n_embd); ``inputs`` (T, n_layer,
        d): per-layer inputs, for layers that take one (``layer.PerLayerInput``)."""
        return executor.run(self.plan, self.blocks, x, batch, ropes, rows=batch.out,
                            inputs=inputs)

    def head(self, x: np.ndarray) -> np.ndarray:
        """Logits (rows, n_vocab) of final hidden states x (rows, n_embd): the output
        projection (and whatever the architecture does after it: an override calls this
        one for the product, which may stop between its halves: ``output_product``)."""
        return output_product(self.output, x)

    # -- the interface --------------------------------------------------------------------------
    def use_kv_type(self, kv_type: str) -> None:
        """Make later caches of type ``kv_type``; a ValueError saying why when this model's
        heads cannot be stored in it (``kv_cache.check_kv_type``)."""
        check_kv_type(kv_type, self.config.head_dim, self.config.head_dim_v)
        for s in {s for s in map(layer_kv_shape, self.blocks) if s is not None}:
            check_kv_type(kv_type, s.head_dim, s.head_dim_v, s.latent)
        self.kv_type = kv_type

    def new_arena(self, n_ctx: int, n_slots: int = 1) -> KVArena:
        """KV cache memory for ``n_slots`` sequences of up to ``n_ctx`` positions each
        (``arena.slots``); sequences batched together must come from one arena. An
        embedding model's slots get one position each, for the engine's bookkeeping:
        ``embed_batch`` makes the arena each pass needs."""
        return self.kv_arena(1 if self.is_encoder else n_ctx, n_slots)

    def kv_arena(self, n_ctx: int, n_slots: int) -> KVArena:
        """``new_arena``'s memory, whatever the model's attention."""
        c = self.config
        return KVArena(c.n_layer, n_slots, n_ctx, c.n_head_kv, c.head_dim, c.head_dim_v,
                       kv_type=self.kv_type, layers=self.kv_shapes())

    def kv_shapes(self) -> tuple[KVShape | None, ...] | None:
        """Each layer's keys and values (None: a layer that reads another's), from the
        layer specs; None when every layer has the config's (one array for all)."""
        c = self.config
        shapes = tuple(map(layer_kv_shape, self.blocks))
        same = KVShape(c.n_head_kv, c.head_dim, c.head_dim_v)
        return None if all(s == same for s in shapes) else shapes

    def cache_bytes(self) -> tuple[int, int]:
        """(bytes of keys and values per position in an F16 cache, over the attention
        layers; bytes of recurrent state per sequence, whatever its length, not counting
        its snapshots)."""
        kv = sum(s.f16_position_bytes for s in map(layer_kv_shape, self.blocks)
                 if s is not None)
        recurrent = self.new_arena(1).recurrent
        return kv, recurrent.slot_bytes if recurrent else 0

    def new_cache(self, n_ctx: int) -> KVCache:
        """An empty KV cache with room for ``n_ctx`` positions (an arena of one slot)."""
        return self.new_arena(n_ctx).slots[0]

    def forward_batch(self, parts: list[Part], pause: Pause | None = None) -> np.ndarray:
        """Evaluate several sequences in one batch (each ``Part``: a cache, its new ids,
        and which logits it wants) and append each one's ids to its cache. Returns the
        wanted logits (rows, n_vocab) in part order. A sequence's logits are bit-identical
        to evaluating it alone. The caller keeps the batch small (see MAX_BATCH).
        ``pause``: run through its stops by ``batch.Pause.drive``."""
        if pause is None:
            return self.forward_steps(parts, stoppable=False).run()
        return pause.drive(self.forward_steps(parts))

    def forward_steps(self, parts: list[Part], stoppable: bool = True) -> Pass:
        """``forward_batch`` as a pass its caller runs a stretch at a time
        (``forward_pass.Pass``): with ``stoppable``, iterating it stops, where ``stop()``
        has asked, between two layers, before the output product and between the halves
        of a big one, so that the caller may evaluate other sequences of the arena there;
        ``logits`` at the end. The ids are checked here, before it runs."""
        self._require_causal()
        for p in parts:
            p.ids = self._check_ids(p.ids)
        return Pass(lambda stops: self._pass(parts, stops), stoppable)

    def _pass(self, parts: list[Part], stops: Stops | None) -> np.ndarray:
        """The body of ``forward_steps``' pass, meeting ``stops`` (if any) on the way."""
        for p in parts:  # a truncated recurrent state: first the ids from its snapshot on
            replay = p.cache.take_replay()
            if replay is not None:
                self.forward_batch([Part(p.cache, replay, NONE)])
        batch = Batch(parts)
        batch.stops = stops
        x = self._forward(batch)                           # (len(batch.out), n_embd)
        if stops is not None:
            stops.at(HEAD)
        batch.advance()
        for p, rows in batch.hidden_rows:
            p.hidden_states = x[rows]
        if batch.logit_rows is not None:
            x = x[batch.logit_rows]
        if not len(x):
            return np.zeros((0, self.config.n_vocab), np.float32)
        return self.head(x)

    def forward(self, ids: list[int] | np.ndarray, cache: KVCache,
                all_logits: bool = False) -> np.ndarray:
        """Evaluate ``ids`` at positions cache.n.. and append them to the cache.

        Returns float32 logits (len(ids), n_vocab) if ``all_logits``, else (n_vocab,) for
        the last id. The ids are one causal batch (split only past MAX_BATCH tokens).
        """
        self._require_causal()
        ids = self._check_ids(ids)
        cache.check_room(len(ids))
        outs = []
        for start in range(0, len(ids), MAX_BATCH):
            chunk = ids[start:start + MAX_BATCH]
            last = start + MAX_BATCH >= len(ids)
            want = ALL if all_logits else LAST if last else NONE
            logits = self.forward_batch([Part(cache, chunk, want)])
            if len(logits):
                outs.append(logits)
        logits = outs[0] if len(outs) == 1 else np.concatenate(outs)
        return logits if all_logits else logits[-1]

    def logits(self, ids: list[int] | np.ndarray) -> np.ndarray:
        """Logits (len(ids), n_vocab) float32 of ``ids`` evaluated from an empty cache."""
        return self.forward(ids, self.new_cache(max(1, len(ids))), all_logits=True)

    def warm_up(self, prompts: bool = False, report: Callable[[int, int, str, float], None]
                | None = None, background: bool = False, join: bool = True) -> None:
        """Run the compiled paths once, so that later calls only load their machine code
        (or, on a first run, compile it now rather than in the middle of a request):
        decoding (two tokens, then one: the team), and a prompt longer than the team takes
        (the layer-by-layer fused steps) when ``prompts`` or when the fused layers are not compiled
        yet. A command with one short prompt skips loading the fused layers; a
        server asks for them, or its first batch of several prompts would load them.

        What has to be compiled is done in steps, ``report(step, steps, what, seconds)``
        called as each starts (seconds: about how long it takes); the prompt path compiles
        in a second process meanwhile when the machine has a second core. ``background``:
        the team and the fused layers compile in a background process instead (``background.py``)
        and this one runs on the reference path until they are ready. ``join`` (unless
        ``background``): a background compilation found in progress is waited for on the
        reference path in the same way, rather than compiled beside (False: compile here,
        as the background process itself and the measuring commands do)."""
        from ..quant import calibrate, kernels

        if self.is_encoder:  # an embedding model: its one path
            self.embed_batch([[0, min(1, self.config.n_vocab - 1)]])
            return
        say = report or (lambda *_: None)
        kinds = self.kernel_types()
        team, more = not self.plan.team_reason, self.plan.steps
        prompt_path = prompts or not compiled((), team, more)
        steps = _compile_steps(kinds, prompt_path, team, more)
        defer = bool(steps.keys() & {"decoding", "prompts"}) and self._can_defer()
        joined = None
        if defer and not background:  # a script's run joins a compilation in progress
            joined = self._compiling(kinds, join_only=True) if join else None
            defer = joined is not None
        if defer:
            steps = {k: v for k, v in steps.items() if k == "types"}
            steps["reference"] = ("the reference path's kernels (the compiled layers: in "
                                  "the background, for later)", _STEP_SECONDS["reference"])
        step = iter(range(1, len(steps) + 1))
        if "types" in steps:  # before the background process starts: it loads them
            say(next(step), len(steps), *steps["types"])
            kernels.prepare(kinds)
            kernels.warm_up(sorted(kinds))
        if kinds:  # decoding's kernel variant for this CPU: read back, or measured once
            calibrate.ensure(self.kernel_types_by_size())
        pending = joined or (self._compiling(kinds) if defer else None)
        if pending is not None:
            self.plan.defer(pending)
        elif defer:  # no process: compile them here after all
            steps["reference"] = ("decoding layers", _STEP_SECONDS["decoding"])
        self._warm_layers(steps, step, say, prompt_path and not self.plan.waiting())

    def _warm_layers(self, steps: dict[str, tuple[str, float]], step: Iterator[int],
                     say: Callable[..., None], prompt_path: bool) -> None:
        """``warm_up``'s forward passes: decoding (the team, or the reference path while
        it compiles elsewhere), then with ``prompt_path`` a prompt for the fused layers."""
        from . import team  # numba: compiled or loaded on first use

        together = "prompts" in steps and "decoding" in steps
        helper = _compile_elsewhere(self) if together else None
        for name in ("decoding", "reference"):
            if name in steps:
                say(next(step), len(steps), *steps[name])
        ids = [0, min(1, self.config.n_vocab - 1)]
        self.forward(ids, self.new_cache(4))
        self.forward(ids[:1], self.new_cache(4))
        if "prompts" in steps:
            say(next(step), len(steps), *steps["prompts"])
            if helper is not None:
                helper.wait()
        if prompt_path:
            n = team.MAX_ROWS + 1
            self.forward([0] * n, self.new_cache(n))

    def _can_defer(self) -> bool:
        """Whether a background process can compile the layers (``warm_up``'s
        ``background``): compiled layers, a model file, a second core."""
        return (self.plan.compiled and bool(getattr(self.gguf, "path", None))
                and (os.cpu_count() or 1) >= 2)

    def _compiling(self, kinds: set[int], join_only: bool = False) -> Any:
        """A background compilation of the compiled layers (``background.Compiling``):
        started in a process of its own, or, with ``join_only`` (or when one is running
        already), the one in progress joined; None when there is none to join or no
        process could be started."""
        from .background import Compiling

        team, more = not self.plan.team_reason, self.plan.steps
        return Compiling.start(str(self.gguf.path), lambda: compiled(kinds, team, more),
                               join_only)

    def embed_batch(self, seqs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """The final hidden states (len(ids), n_embd) of each id sequence, each evaluated
        whole in one pass, with bidirectional attention where the file says so
        (``bidirectional.embed_sequences``)."""
        return bidirectional.embed_sequences(self, seqs)

    def kernel_types_by_size(self) -> list[int]:
        """``kernel_types()``, the type holding most of the model's bytes first."""
        size = dict.fromkeys(self.kernel_types(), 0)
        for t in self.gguf.tensors.values():
            if int(t.type) in size:
                size[int(t.type)] += t.data.nbytes
        return sorted(size, key=lambda k: (-size[k], k))

    def kernel_types(self) -> set[int]:
        """The ggml type ids of this model's tensors that have integer kernels."""
        from ..quant.kerneltypes import KERNEL_TYPES

        return {int(t.type) for t in self.gguf.tensors.values() if t.type in KERNEL_TYPES}

    def _require_causal(self) -> None:
        """A ValueError for next-token logits from a bidirectional model."""
        if not self.config.causal:
            arch = self.config.arch
            raise ValueError(f"this {arch} model's attention is bidirectional "
                             f"({arch}.attention.causal = false): it computes embeddings "
                             "(embed_batch), not next-token logits, so it cannot generate "
                             "text")

    def _check_ids(self, ids: list[int] | np.ndarray) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"expected a non-empty 1-D sequence of token ids, got shape "
                             f"{arr.shape}")
        if arr.dtype.kind not in "iu":
            raise ValueError(f"token ids must be integers, got {arr.dtype}")
        bad = (arr < 0) | (arr >= self.config.n_vocab)
        if bad.any():
            raise ValueError(f"token id {int(arr[bad][0])} is outside the vocabulary "
                             f"(0..{self.config.n_vocab - 1})")
        return arr.astype(np.int64, copy=False)

    def __repr__(self) -> str:
        c = self.config
        return (f"{type(self).__name__}({c.arch}, {c.n_layer} layers, n_embd {c.n_embd}, "
                f"{c.n_head}/{c.n_head_kv} heads, vocab {c.n_vocab})")


def layer_kv_shape(b: Block) -> KVShape | None:
    """What layer ``b`` keeps per position in the cache: its keys and values, its latent
    (multi-head latent attention), or None (a recurrent layer, a layer reading another's)."""
    a = b.attn
    if isinstance(a, LatentAttention):
        return KVShape(1, a.width, a.kv_lora, latent=True)
    if isinstance(a, Attention) and a.kv_layer is None:
        return KVShape(a.n_head_kv, a.head_dim, a.head_dim_v)
    return None


def import_kernels() -> None:
    """Import numba and the compiled paths' modules in the calling thread.

    numba's package has import cycles that break when two threads import it at once: one of
    them meets a partly initialised module (``ImportError: cannot import name ...``). An
    engine calls this in the thread that builds it, before its own thread starts, so that a
    program importing numba (or something built on it) meanwhile cannot collide with the
    engine thread's first step."""
    from ..quant import kernels, matrix  # noqa: F401
    from . import attention, deltanet, fused, rowkernels, team  # noqa: F401


def compiled(kinds: Iterable[int] = (), team: bool = True, steps: tuple[str, ...] = ()
             ) -> bool:
    """True when the machine code of the kernels (and the row kernels of weight types
    ``kinds``), the team (decoding; with ``team``: a plan that uses it) and the fused layers
    (longer prompts, and every batch of a plan without the team; ``steps``: the other
    compiled steps the plan runs, ``Plan.steps``) is cached on disk: a start then takes
    about a second; otherwise the first calls compile them (a minute or two, once)."""
    from ..quant import kernels
    from ..quant.jitcache import cached

    return kernels.is_compiled(tuple(kinds)) and cached(_layer_code(team, steps))


def _layer_code(team: bool, steps: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """The compiled layers' dispatchers a plan runs: the team's where it has one, the
    fused steps', then the others named in ``steps`` ("module.name" in this package)."""
    import importlib

    from . import fused
    from . import team as team_module

    more = tuple(getattr(importlib.import_module(f"{__package__}.{mod}"), name)
                 for mod, name in (step.split(".") for step in steps))
    return ((team_module.stack_team,) if team else ()) + (fused.attention_step,
                                                          fused.ffn_step) + more


# About how long each step of a first run's compilation takes on a quiet 2-core machine
# (seconds): the weight types' row kernels (each) and the products, the decoding path
# (the team), the prompt path (the fused layers; in a second process while the team compiles),
# or instead of those two the reference path's kernels (``warm_up``'s ``background``)
_STEP_SECONDS = {"type": 2.0, "products": 10.0, "decoding": 90.0, "prompts": 75.0,
                 "reference": 20.0}


def _compile_steps(kinds: set[int], prompts: bool, team: bool = True,
                   more: tuple[str, ...] = ()) -> dict[str, tuple[str, float]]:
    """What a warm-up has to compile, in order: ``{step: (what, seconds)}``; ``team``
    False: the plan decodes through the fused layers (no team to compile); ``more`` the
    other steps, as ``compiled`` takes them."""
    from ..gguf.types import GGMLType
    from ..quant import int_tiles, kernels
    from ..quant.jitcache import cached
    from . import fused

    steps = {}
    todo = sorted(k for k in kinds if not int_tiles.kernel_cached(k))
    if todo or not kernels.is_compiled():
        names = ", ".join(GGMLType(k).ggml_name for k in todo)
        steps["types"] = (f"row kernels{' for ' + names if names else ''} and the products",
                          _STEP_SECONDS["type"] * len(todo) + _STEP_SECONDS["products"])
    if not team:  # every batch through the fused layers
        if not cached(_layer_code(False, more)):
            steps["decoding"] = ("decoding and prompt layers", _STEP_SECONDS["prompts"])
        return steps
    if not cached(_layer_code(True)[:1]):
        steps["decoding"] = ("decoding layers", _STEP_SECONDS["decoding"])
    if prompts and not cached((fused.attention_step, fused.ffn_step)):
        alone = "decoding" not in steps or (os.cpu_count() or 1) < 2
        steps["prompts"] = ("prompt layers" + ("" if alone else " (compiled alongside)"),
                            _STEP_SECONDS["prompts"] if alone else 10.0)
    return steps


def _compile_elsewhere(model: Model) -> subprocess.Popen | None:
    """A second process compiling the prompt path of ``model``'s file into numba's disk
    cache (``warm_prompt_path``) while this one compiles the decoding path; None on a
    machine with one core (or when it cannot start)."""
    if (os.cpu_count() or 1) < 2 or not getattr(model.gguf, "path", None):
        return None
    from .background import python_child

    try:
        return python_child("gguflm.model.base", "warm_prompt_path", str(model.gguf.path))
    except OSError:
        return None


def warm_prompt_path(path: str) -> None:
    """Compile (or load) the prompt path of the model in file ``path``: a prompt longer
    than the team takes, through the fused layers (``_compile_elsewhere``'s second process)."""
    from . import load_model, team

    model = load_model(path)
    model.forward([0] * (team.MAX_ROWS + 1), model.new_cache(team.MAX_ROWS + 1))
