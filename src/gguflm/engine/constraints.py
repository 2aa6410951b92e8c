"""Constrained decoding at run time: llguidance's masks applied to our logits.

At each step the tokens that cannot continue a valid output are masked (their logits set to
-inf) before sampling, so the output is valid by construction, for every sampler and
temperature. llguidance (the Rust engine llama.cpp can use for grammars) computes the mask
from a byte-level view of our vocabulary:

* ``ll_tokenizer`` builds that view once per ``Tokenizer``: each token's bytes as the model
  writes them (SentencePiece ``\u2581`` -> space, GPT-2 byte alphabet -> bytes, ``<0xNN>``
  byte tokens -> the byte); control tokens, which print nothing, are marked special by
  their text (a grammar can name them, ``<|im_end|>``, but no text matches them), as
  llama.cpp's llguidance sampler marks them. All end-of-generation ids are its EOS set.
* ``Constraint`` is one sequence's matcher for a ``grammar.Grammar``: ``mask(logits)``
  before sampling, ``accept(id)`` after. Once the output is complete and cannot be
  extended only EOS is allowed, so a constrained generation ends with EOS (finish_reason
  "stop") unless max_tokens cuts it ("length").
* ``fill_bitmasks``/``apply_bitmask`` do a batch at once. The engine's ``Job`` calls
  ``mask`` before and ``accept`` after sampling each generated token (``Request.constraint``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np

from ..tokenizer.unicode_data import UNICODE_TO_BYTE
from ..tokenizer.vocab import Attr
from .errors import ConstraintError, ConstraintFailure
from .grammar import (
    TOO_COMPLEX,
    client_message,
    is_panic,
    limits_for,
    llguidance_errors,
    release_memory,
)

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer
    from .grammar import Grammar

__all__ = ["Constraint", "apply_bitmask", "fill_bitmasks",
           "ll_tokenizer", "ll_tokenizer_build_seconds", "special_tokens", "token_bytes"]


# --- the tokenizer, as llguidance sees it ----------------------------------------------------

_HIDDEN = int(Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED)
# GPT-2's byte alphabet -> the byte as a latin-1 character; any other character below 256
# maps to U+FFFF, which latin-1 cannot encode, so that such tokens take the exact slow path
_BYTE_TABLE = {c: 0xFFFF for c in range(256)}
_BYTE_TABLE.update({ord(ch): b for ch, b in UNICODE_TO_BYTE.items()})


def token_bytes(tokenizer: Tokenizer) -> tuple[list[bytes], list[int]]:
    """Every token's bytes as generated text shows them (``token_to_piece``), and the ids of
    the special tokens: those that print nothing but have a text (control tokens), given
    their text. Normal tokens take a vectorised path (a large vocabulary is slow token by
    token)."""
    v = tokenizer.vocab
    attrs = v.attrs
    normal = (attrs & int(Attr.NORMAL) != 0) & (attrs & _HIDDEN == 0)
    out: list[bytes] = [b""] * v.n_vocab
    if v.kind == "spm" or v.escape_whitespaces:
        for i in np.flatnonzero(normal).tolist():
            out[i] = v.tokens[i].replace("\u2581", " ").encode("utf-8", "surrogateescape")
    else:  # byte-level BPE
        for i in np.flatnonzero(normal).tolist():
            try:
                out[i] = v.tokens[i].translate(_BYTE_TABLE).encode("latin-1")
            except UnicodeEncodeError:  # outside the byte alphabet: llama.cpp's marker text
                out[i] = tokenizer.token_to_piece(i)
    special: list[int] = []
    for i in np.flatnonzero(~normal).tolist():
        piece = tokenizer.token_to_piece(i)
        if not piece:
            piece = tokenizer.token_to_piece(i, special=True)
            if piece:
                special.append(i)
        out[i] = piece
    return out, special


class _Vocab:
    """What ``llguidance.TokenizerWrapper`` reads (token bytes, EOS/BOS, special ids) and the
    encoder it calls: llguidance allows only our (canonical) tokenization of text that the
    grammar forces, so this must tokenize exactly as the model's tokenizer does."""

    def __init__(self, tokenizer: Tokenizer, eos: int) -> None:
        self.tokens, self.special_token_ids = token_bytes(tokenizer)
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.bos_id
        self._encode = tokenizer.encode

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        try:
            # llguidance tokenizes pieces of output (text it forces): no space prefix
            return self._encode(text, add_special=False, space_prefix=False)
        except Exception:  # noqa: BLE001 - an exception here would abort inside Rust
            return []


@dataclass
class _TokEntry:
    ll: llguidance.LLTokenizer
    eos_ids: tuple[int, ...]
    build_seconds: float
    lock: threading.Lock
    matchers: OrderedDict[str, tuple[llguidance.LLMatcher, int]]  # compiled, unstarted;
    # with the memory each took (bytes)
    special: dict[str, int]  # the special tokens' texts -> ids (as llguidance sees them)


_TOKENIZERS: weakref.WeakKeyDictionary[Any, _TokEntry] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()
_MATCHER_CACHE_SIZE = 32
# the cache's bound in bytes: a compiled grammar's size varies by orders of magnitude (a few
# KB for most schemas; tens of MB for a lexer near LIMITS), so a count alone bounds nothing
MATCHER_CACHE_BYTES = 256 * 2**20
PROBE_STEPS = 4  # steps walked through a new grammar before it is accepted (see _probe)
RELEASE_BYTES = 8 * 2**20  # heap given back to the system after dropping this much grammar


def _entry(tokenizer: Tokenizer) -> _TokEntry:
    with _TOKENIZERS_LOCK:  # built once even when requests race (it takes seconds)
        entry = _TOKENIZERS.get(tokenizer)
        if entry is None:
            t0 = time.perf_counter()
            eos_ids = tuple(sorted(tokenizer.eog_ids))
            if not eos_ids:
                raise ConstraintError("the model's vocabulary has no end-of-generation token, "
                                      "which constrained decoding needs")
            vocab = _Vocab(tokenizer, eos_ids[0])
            wrapper = llguidance.TokenizerWrapper(vocab)
            ll = llguidance.LLTokenizer(wrapper, n_vocab=tokenizer.n_vocab,
                                        eos_token=list(eos_ids))
            special = {vocab.tokens[i].decode("utf-8", "replace"): i
                       for i in vocab.special_token_ids}
            entry = _TokEntry(ll, eos_ids, time.perf_counter() - t0, threading.Lock(),
                              OrderedDict(), special)
            _TOKENIZERS[tokenizer] = entry
        return entry


def ll_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The llguidance tokenizer for ``tokenizer``, built on first use and cached for as long
    as ``tokenizer`` lives (building takes a while for a large vocabulary; call this when
    loading a model to have it ready)."""
    return _entry(tokenizer).ll


def special_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    """The texts of the tokens llguidance takes as special (``<[id]>`` in a grammar), with
    their ids; from the same walk of the vocabulary as ``ll_tokenizer``."""
    return _entry(tokenizer).special


def ll_tokenizer_build_seconds(tokenizer: Tokenizer) -> float:
    """How long building ``ll_tokenizer(tokenizer)`` took."""
    return _entry(tokenizer).build_seconds


# --- one sequence's constraint ---------------------------------------------------------------

def _matcher(entry: _TokEntry, grammar: Grammar) -> llguidance.LLMatcher:
    """A fresh matcher: a copy of the cached compiled one (far cheaper than compiling the
    grammar again)."""
    with entry.lock:
        cached = entry.matchers.get(grammar.ll_grammar)
        if cached is None:
            before = _resident_bytes()
            accepted = False
            try:
                with llguidance_errors(grammar.param, f"{grammar.kind} grammar"):
                    template = llguidance.LLMatcher(entry.ll, grammar.ll_grammar, log_level=0,
                                                    limits=limits_for(grammar.ll_grammar))
                    _probe(template, grammar, entry.eos_ids, entry.ll.vocab_size)
                accepted = True
            finally:
                cost = max(_resident_bytes() - before, 4 * len(grammar.ll_grammar), 2**16)
                if not accepted:
                    template = None  # dropped before the memory is given back
                if not accepted or cost > RELEASE_BYTES:
                    release_memory()
            cached = template, cost
            entry.matchers[grammar.ll_grammar] = cached
            evicted = 0
            while len(entry.matchers) > 1 and (
                    len(entry.matchers) > _MATCHER_CACHE_SIZE
                    or sum(c for _, c in entry.matchers.values()) > MATCHER_CACHE_BYTES):
                evicted += entry.matchers.popitem(last=False)[1][1]
            if evicted > RELEASE_BYTES:
                release_memory()
        else:
            entry.matchers.move_to_end(grammar.ll_grammar)
        with llguidance_errors(grammar.param, f"{grammar.kind} grammar"):
            return cached[0].deep_copy()


def _probe(template: llguidance.LLMatcher, grammar: Grammar, eos_ids: tuple[int, ...],
           n_vocab: int) -> None:
    """Walk a copy of a new grammar's matcher a few steps (the first allowed token that is
    not EOS each time) and refuse the grammar, as a ConstraintError naming its request
    field, if llguidance fails on the way or allows nothing. Grammars that pass validation
    but break at once (a rule that only refers to itself, a regex that matches nothing,
    a repetition or alternation past llguidance's limits) are then a 400 before any
    generation, not a failure in the middle of one."""
    m = template.deep_copy()
    bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
    for _ in range(PROBE_STEPS):
        if m.is_error() or m.is_stopped():
            break
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if m.is_error():
            break
        allowed = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))
        if not allowed.size:
            raise ConstraintError(f"invalid {grammar.kind} grammar: it allows no output",
                                  param=grammar.param)
        other = allowed[~np.isin(allowed, eos_ids)]
        if not other.size:
            break
        m.consume_token(int(other[0]))
    if m.is_error():
        raise ConstraintError(f"invalid {grammar.kind} grammar: {_short_error(m)}",
                              param=grammar.param)


def _short_error(m: llguidance.LLMatcher) -> str:
    """llguidance's error for the client: shortened, without parser state or a panic's
    text (``grammar.client_message``)."""
    try:
        error = m.get_error()
    except BaseException as e:
        if not is_panic(e):
            raise
        return TOO_COMPLEX
    msg = client_message(error.split("\n<state>")[0].split("<non-verbose")[0]).rstrip("; ")
    if "NoExtensionBias" in msg or not msg:
        return "it allows no output here (such as a rule that only refers to itself)"
    return msg


@contextmanager
def _failure_on_panic() -> Iterator[None]:
    """A Rust panic in llguidance while generating (pyo3's PanicException, a BaseException
    that would otherwise end the engine's thread) as this sequence's ConstraintFailure."""
    try:
        yield
    except BaseException as e:
        if not is_panic(e):
            raise
        raise ConstraintFailure(f"constrained decoding failed: {TOO_COMPLEX}") from None


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except (OSError, ValueError, IndexError):
        return 0


class Constraint:
    """One sequence's grammar state: ``mask`` the logits before each sampling step,
    ``accept`` each generated token. Not thread-safe (one sequence, one thread at a time).

    Timing: ``compile_seconds`` (making the matcher); ``masks``, the number of ``mask`` calls,
    and their time: ``mask_seconds`` in all, of which ``compute_seconds`` computing the
    allowed set (llguidance) and the rest applying it to the logits."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer) -> None:
        t0 = time.perf_counter()
        entry = _entry(tokenizer)
        self.grammar = grammar
        self.n_vocab = tokenizer.n_vocab
        self.eos_ids = entry.eos_ids
        self._matcher = _matcher(entry, grammar)
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self._fresh = False  # _bits holds the mask of the current state
        self.compile_seconds = time.perf_counter() - t0
        self.mask_seconds = 0.0
        self.compute_seconds = 0.0
        self.masks = 0

    # the allowed set, as a bitmask (bit t of word t // 32 set: token t may come next)
    def fill_bitmask(self, out: np.ndarray | None = None) -> np.ndarray:
        """Compute the current state's allowed tokens into ``out`` (int32 words, one bit per
        token; default: this constraint's own buffer) and return it. Raises
        ``ConstraintFailure`` if llguidance has failed."""
        out = self._bits if out is None else out
        if out.dtype != np.int32 or out.ndim != 1 or not out.flags["C_CONTIGUOUS"] \
                or out.size != self._bits.size:
            raise ValueError(f"the bitmask must be {self._bits.size} contiguous int32 words")
        with _failure_on_panic():
            self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)  # no GIL
        self._check()
        if out is self._bits:
            self._fresh = True
        return out

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of tokens that cannot come next to -inf, in place (``logits`` is the
        float vector of one position; entries past the vocabulary are masked too)."""
        t0 = time.perf_counter()
        if not self._fresh:
            self.fill_bitmask()
        self.compute_seconds += time.perf_counter() - t0
        if not self._bits.any():
            raise ConstraintFailure("the grammar allows no token here (llguidance: "
                                    f"{self._matcher.stop_reason()})")
        apply_bitmask(logits, self._bits)
        self.mask_seconds += time.perf_counter() - t0
        self.masks += 1

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next (the state's mask is computed if it is not yet)."""
        if not self._fresh:
            self.fill_bitmask()
        return 0 <= token < self.n_vocab and bool((self._bits[token >> 5] >> (token & 31)) & 1)

    def accept(self, token: int) -> None:
        """Advance past ``token`` (a generated one). Raises ``ConstraintFailure`` if the
        grammar does not allow it."""
        self._fresh = False
        with _failure_on_panic():
            fits = self._matcher.consume_token(int(token))
        if not fits:
            raise ConstraintFailure(f"token {token} does not fit the grammar: "
                                    f"{_short_error(self._matcher)}")

    def is_done(self) -> bool:
        """The output is complete and cannot be extended: only EOS may come next (or came)."""
        with _failure_on_panic():
            return self._matcher.is_stopped() and not self._matcher.is_error()

    def is_accepting(self) -> bool:
        """The output so far is a complete match (it may still be extended)."""
        with _failure_on_panic():
            return self._matcher.is_accepting()

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (may be empty): an engine may evaluate them in one
        batch instead of sampling them one by one."""
        with _failure_on_panic():
            return list(self._matcher.compute_ff_tokens())

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens."""
        self._fresh = False
        with _failure_on_panic():
            done = not n or self._matcher.rollback(n)
        if not done:
            raise ConstraintFailure(f"cannot roll back {n} tokens: "
                                    f"{_short_error(self._matcher)}")

    def reset(self) -> None:
        """Back to the start of the grammar (and the timing counters to zero)."""
        self._fresh = False
        with _failure_on_panic():
            self._matcher.reset()
        self.mask_seconds, self.compute_seconds, self.masks = 0.0, 0.0, 0

    def _check(self) -> None:
        with _failure_on_panic():
            failed = self._matcher.is_error()
        if failed:
            raise ConstraintFailure(f"constrained decoding failed: "
                                    f"{_short_error(self._matcher)}")

    @property
    def matcher(self) -> llguidance.LLMatcher:
        """The llguidance matcher (for ``fill_bitmasks`` over a batch)."""
        return self._matcher


def apply_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> None:
    """Logits of tokens whose bit is clear -> -inf, in place. ``logits`` (n,) with ``bitmask``
    (words,), or (batch, n) with (batch, words); columns past 32 * words are masked too."""
    if logits.ndim == 1:
        logits, bitmask = logits[None, :], bitmask[None, :]
    n = logits.shape[1]
    n_bits = 32 * bitmask.shape[1]
    if n > n_bits:
        logits[:, n_bits:] = -np.inf
        n = n_bits
    # unpack the words' bits (little-endian within each word, as llguidance writes them)
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, count=n, bitorder="little")
    np.putmask(logits[:, :n], bits == 0, -np.inf)


_EXECUTOR: llguidance.LLExecutor | None = None


def fill_bitmasks(constraints: Sequence[Constraint], bitmask: np.ndarray) -> None:
    """The masks of a batch of sequences, computed in parallel by llguidance's thread pool
    (without the GIL) into ``bitmask`` (len(constraints), words) int32, row i for
    ``constraints[i]``. For a scheduler: compute, then ``apply_bitmask`` to the batch's
    logits."""
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = llguidance.LLExecutor()
    if bitmask.dtype != np.int32 or bitmask.ndim != 2 or not bitmask.flags["C_CONTIGUOUS"] \
            or bitmask.shape[0] < len(constraints):
        raise ValueError("bitmask must be a C-contiguous (batch, words) int32 array")
    if not constraints:
        return
    with _failure_on_panic():
        _EXECUTOR.unsafe_compute_mask_ptr([(c.matcher, i) for i, c in enumerate(constraints)],
                                          bitmask.ctypes.data, bitmask.shape[1] * 4,
                                          bitmask.shape[0])
    for c in constraints:
        c._fresh = False  # their own buffers were not filled
        c._check()


# --- the hook into today's generation loop ---------------------------------------------------
