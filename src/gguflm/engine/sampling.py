"""Token sampling with llama.cpp's defaults, order and random numbers.

The chain is the one llama.cpp's common sampler builds by default (common/common.h,
common/sampling.cpp; each step as in src/llama-sampler.cpp):

    penalties -> top-k -> typical-p -> top-p -> min-p -> temperature -> draw

Each step narrows or reshapes a candidate list (token ids with logits, in an order that
matters for the draw, as in llama.cpp). ``temp <= 0`` keeps only the highest logit
(greedy), after the penalties. ``samplers`` reorders or drops steps (llama.cpp's
``--samplers``). ``mirostat`` 1 or 2 replaces the chain, as in llama.cpp, with temperature
then Mirostat (v1: top-k from an estimated Zipf exponent; v2: a surprise cut-off), whose
target surprise ``mu`` the sampler keeps and steers by ``mirostat_eta`` toward
``mirostat_tau``.

The sampler owns its RNG: numpy's MT19937 seeded exactly as ``std::mt19937(seed)``, and
each draw is the double ``std::uniform_real_distribution<double>(0, 1)`` makes from two
32-bit outputs (libstdc++'s ``generate_canonical``), consumed as llama.cpp's ``dist``
sampler does (one draw per sampled token, greedy included). The same seed therefore
gives the same tokens, and on identical logits the same tokens as llama.cpp.
"""

from __future__ import annotations

import math
import os
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_SAMPLERS", "Candidates", "Sampler", "SamplerParams", "SamplingError",
           "parse_samplers"]

# llama.cpp's default chain (common.h); dry, top_n_sigma and xtc are off at its defaults
# and gguflm does not have them, so they are accepted as steps that do nothing
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                    "xtc", "temperature")
_CANONICAL = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc",
              "penalties")
# llama.cpp's spellings (common_sampler_types_from_names): kebab-case, no dash, and these
_SAMPLER_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p",
                    **{n.replace("_", "-"): n for n in _CANONICAL if "_" in n},
                    **{n.replace("_", ""): n for n in _CANONICAL if "_" in n},
                    **{n: n for n in _CANONICAL}}
# --sampler-seq's letters (common_sampler_type_to_chr)
_SAMPLER_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma",
                  "m": "min_p", "t": "temperature", "x": "xtc", "e": "penalties"}


def parse_samplers(value: str | Iterable[str]) -> tuple[str, ...]:
    """The sampler steps of ``value``: names separated by ';' (``--samplers``; also a list
    of names) or, for a word of --sampler-seq's letters (``edkypmxt``), those letters."""
    if not isinstance(value, str | list | tuple):
        raise SamplingError(f"samplers must be a string or a list of names, got {value!r}",
                            "samplers")
    if isinstance(value, str):
        names = [n for n in value.split(";") if n] if ";" in value or value.lower() in \
            _SAMPLER_ALIASES else None
        if names is None:
            if all(ch in _SAMPLER_CHARS for ch in value) and len(value) <= 64:
                return tuple(_SAMPLER_CHARS[ch] for ch in value)
            names = [value]
    else:
        names = list(value)
    if len(names) > 64:
        raise SamplingError(f"samplers: at most 64 steps, got {len(names)}", "samplers")
    out = []
    for name in names:
        key = name.lower() if isinstance(name, str) else None
        if key not in _SAMPLER_ALIASES:
            shown = repr(name)[:40] + ("..." if len(repr(name)) > 40 else "")
            raise SamplingError(f"samplers: unknown sampler {shown} (known: "
                                f"{', '.join(_CANONICAL)})", "samplers")
        out.append(_SAMPLER_ALIASES[key])
    return tuple(out)


class SamplingError(ValueError):
    """An invalid sampling parameter: the message names it and the allowed range, ``field``
    is the SamplerParams field it is about (the caller maps it to the name it uses)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SamplerParams:
    """Sampling settings; the defaults are llama.cpp's (``common_params_sampling``)."""

    temp: float = 0.8  # <= 0: greedy
    top_k: int = 40  # <= 0: whole vocabulary
    top_p: float = 0.95  # 1.0: off
    min_p: float = 0.05  # 0.0: off
    typical_p: float = 1.0  # 1.0: off
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = 64  # tokens of history the penalties look at; 0: off, -1: all
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_keep: int = 0  # top-p/min-p/typical-p keep at least this many candidates
    seed: int | None = None  # None: a random seed (Sampler.seed tells which)
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS  # the chain's steps, in order
    mirostat: int = 0  # 0: off; 1: Mirostat; 2: Mirostat 2.0 (instead of the chain)
    mirostat_tau: float = 5.0  # target surprise (entropy), in bits
    mirostat_eta: float = 0.1  # learning rate

    def __post_init__(self) -> None:
        _finite("temp", self.temp)
        _int("top_k", self.top_k)
        _unit("top_p", self.top_p)
        _unit("min_p", self.min_p)
        _unit("typical_p", self.typical_p)
        _finite("repeat_penalty", self.repeat_penalty)
        if self.repeat_penalty <= 0:
            raise SamplingError(f"repeat_penalty must be > 0, got {self.repeat_penalty}",
                                "repeat_penalty")
        _int("repeat_last_n", self.repeat_last_n)
        if self.repeat_last_n < -1:
            raise SamplingError(f"repeat_last_n must be >= -1, got {self.repeat_last_n}",
                                "repeat_last_n")
        _finite("frequency_penalty", self.frequency_penalty)
        _finite("presence_penalty", self.presence_penalty)
        _int("min_keep", self.min_keep)
        if self.min_keep < 0:
            raise SamplingError(f"min_keep must be >= 0, got {self.min_keep}", "min_keep")
        object.__setattr__(self, "samplers", parse_samplers(self.samplers))
        _int("mirostat", self.mirostat)
        if self.mirostat not in (0, 1, 2):
            raise SamplingError(f"mirostat must be 0, 1 or 2, got {self.mirostat}", "mirostat")
        _finite("mirostat_tau", self.mirostat_tau)
        _finite("mirostat_eta", self.mirostat_eta)
        if self.seed is not None:
            _int("seed", self.seed)
            if not 0 <= self.seed <= 0xFFFFFFFF:
                raise SamplingError(f"seed must be in 0..4294967295, got {self.seed}", "seed")

    @property
    def greedy(self) -> bool:
        """The chain keeps only the highest logit (temperature <= 0 is one of its steps)."""
        return self.temp <= 0 and not self.mirostat and "temperature" in self.samplers

    @property
    def penalties_on(self) -> bool:
        return self.repeat_last_n != 0 and not self.mirostat and "penalties" in self.samplers \
            and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0)


def _finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SamplingError(f"{name} must be a finite number, got {value!r}", name)


def _unit(name: str, value: float) -> None:
    _finite(name, value)
    if not 0.0 <= value <= 1.0:
        raise SamplingError(f"{name} must be between 0 and 1, got {value}", name)


def _int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SamplingError(f"{name} must be an integer, got {value!r}", name)


class Candidates:
    """Token ids and their (float32) logits, in list order; ``sorted`` when that order is
    descending by logit. Every filter below narrows or reorders it like llama.cpp's."""

    __slots__ = ("ids", "logits", "sorted")

    def __init__(self, ids: np.ndarray, logits: np.ndarray, sorted: bool = False) -> None:
        self.ids = ids
        self.logits = logits
        self.sorted = sorted

    @classmethod
    def from_logits(cls, logits: np.ndarray) -> Candidates:
        """All tokens in vocabulary order, as llama.cpp starts each step."""
        lg = np.array(logits, dtype=np.float32).reshape(-1)  # a copy: filters edit it
        return cls(np.arange(lg.size, dtype=np.int64), lg)

    def __len__(self) -> int:
        return int(self.ids.size)

    def take(self, idx: np.ndarray | slice, sorted: bool) -> None:
        self.ids, self.logits, self.sorted = self.ids[idx], self.logits[idx], sorted

    def sort(self, k: int | None = None) -> None:
        """Descending by logit (ties: lower id first); keep only the first k if given."""
        n = len(self)
        k = n if k is None else min(k, n)
        if not self.sorted or k < n:
            if k < n:  # partial sort: select the top k, then order just those
                # the k-th highest logit bounds them (np.partition of values is several
                # times faster than argpartition on a large vocabulary); ties with it go in
                # too and the lower ids win the last places
                kth = np.partition(self.logits, n - k)[n - k]
                top = np.flatnonzero(self.logits >= kth)
                if len(top) < k:  # NaN logits: keep argpartition's choice
                    top = np.argpartition(-self.logits, k - 1)[:k]
                order = top[np.lexsort((self.ids[top], -self.logits[top]))][:k]
            else:
                order = np.lexsort((self.ids, -self.logits))
            self.take(order, sorted=True)

    def probs(self) -> np.ndarray:
        """Softmax over the candidates in list order (float32, like llama.cpp)."""
        p = np.exp(self.logits - self.logits.max(), dtype=np.float32)
        return p / _seqsum(p)


def _seqsum(x: np.ndarray) -> np.float32:
    # llama.cpp adds floats left to right; np.sum's pairwise sum rounds differently
    return np.cumsum(x, dtype=np.float32)[-1]


# --- the filters, in chain order ------------------------------------------------------

def apply_penalties(c: Candidates, counts: Counter[int], repeat: float, frequency: float,
                    presence: float) -> None:
    """Repeat penalty (divide a positive logit, multiply a negative one), then subtract
    count * frequency + presence for every token seen in the recent history."""
    if not counts:
        return
    pos = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    if c.sorted or len(c) != c.ids[-1] + 1:  # after another step (--samplers): by id
        where = {int(t): i for i, t in enumerate(c.ids)}
        found = [(where[t], k) for t, k in zip(pos.tolist(), n.tolist(), strict=True)
                 if t in where]
        pos = np.array([i for i, _ in found], dtype=np.int64)
        n = np.array([k for _, k in found], dtype=np.float32)
    inside = (pos >= 0) & (pos < len(c))  # first in the chain: candidate i is token i
    pos, n = pos[inside], n[inside]
    lg = c.logits[pos]
    lg = np.where(lg <= 0, lg * np.float32(repeat), lg / np.float32(repeat))
    lg = lg - (n * np.float32(frequency) + np.float32(presence))
    c.logits[pos] = np.where(np.isnan(lg), -np.inf, lg)  # -inf (masked) stays out of reach
    c.sorted = False


def apply_top_k(c: Candidates, k: int) -> None:
    """Keep the k highest logits, sorted (k <= 0: keep all, as llama.cpp does)."""
    if k > 0:
        c.sort(k)


def apply_typical(c: Candidates, p: float, min_keep: int) -> None:
    """Locally typical sampling: keep the tokens whose surprise is closest to the entropy
    until their probability mass exceeds p; the list ends up in that order."""
    if p >= 1.0:
        return
    c.sort()
    probs = c.probs()
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(probs)
        entropy = -_seqsum(np.where(probs > 0, probs * logp, np.float32(0)))
        shifted = np.abs(-logp - entropy)
    order = np.argsort(shifted, kind="stable")
    cum = np.cumsum(probs[order], dtype=np.float32)
    ok = (cum > p) & (np.arange(len(c)) >= min_keep - 1)
    last = int(np.argmax(ok)) + 1 if ok.any() else len(c)
    c.take(order[:last], sorted=False)


def apply_top_p(c: Candidates, p: float, min_keep: int) -> None:
    """Keep the smallest prefix (by descending probability) whose mass reaches p."""
    if p >= 1.0:
        return
    c.sort()
    cum = np.cumsum(c.probs(), dtype=np.float32)
    ok = (cum >= np.float32(p)) & (np.arange(1, len(c) + 1) >= min_keep)
    last = int(np.argmax(ok)) + 1 if ok.any() else len(c)
    c.take(slice(0, last), sorted=True)


def apply_min_p(c: Candidates, p: float, min_keep: int) -> None:
    """Keep the tokens with probability >= p * (the highest probability)."""
    if p <= 0.0 or not len(c):
        return
    threshold = np.float32(c.logits.max()) + np.float32(math.log(p))
    keep = c.logits >= threshold
    n_keep = int(keep.sum())
    if not c.sorted and n_keep >= max(min_keep, 1):
        c.take(np.flatnonzero(keep), sorted=False)  # order kept, as llama.cpp's fast path
        return
    c.sort()
    c.take(slice(0, min(len(c), max(n_keep, min_keep))), sorted=True)


def apply_temperature(c: Candidates, temp: float) -> None:
    """Divide logits by temp; temp <= 0 keeps only the (first) highest logit."""
    if temp <= 0:
        best = int(np.argmax(c.logits))
        c.take(slice(best, best + 1), sorted=True)
    else:
        c.logits = c.logits / np.float32(temp)


def draw(c: Candidates, u: float) -> int:
    """The candidate whose cumulative probability first reaches u (0 <= u < 1), with
    llama.cpp's arithmetic: float exp, double running sum, in list order."""
    p = np.exp(c.logits - c.logits.max(), dtype=np.float32).astype(np.float64)
    cum = np.cumsum(p)
    i = int(np.searchsorted(cum, cum[-1] * u, side="left"))
    return int(c.ids[min(i, len(c) - 1)])


# --- Mirostat (llama.cpp's llama_sampler_mirostat / _v2, float32 as there) -------------

MIROSTAT_M = 100  # tokens v1 estimates the Zipf exponent from (llama.cpp passes 100)


def _softmax_sorted(c: Candidates) -> np.ndarray:
    """llama_sampler_softmax_impl(sorted): sort, then glibc's expf (the double exp,
    rounded: numpy's float32 exp is an ulp off for many inputs, and Mirostat feeds the
    probabilities back into mu) and a left-to-right float sum."""
    c.sort()
    return _glibc_softmax(c.logits)


def _glibc_softmax(logits: np.ndarray) -> np.ndarray:
    x = (logits - logits.max()).astype(np.float64)
    p = np.exp(x).astype(np.float32)
    return p / _seqsum(p)


def mirostat_v1_top_k(p: np.ndarray, mu: float, n_vocab: int, m: int = MIROSTAT_M) -> int:
    """How many candidates Mirostat keeps: the k whose expected surprise is ``mu``, for
    the Zipf exponent s_hat estimated by least squares from the first ``m`` sorted
    probabilities ``p``."""
    f = np.float32
    n = min(m - 1, len(p) - 1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        i = np.arange(n, dtype=np.float32)
        t = _f32(np.log, (i + f(2)) / (i + f(1)))  # logf, powf: glibc's, rounded doubles
        b = _f32(np.log, p[:n] / p[1:n + 1])
        s_hat = _seqsum(t * b) / _seqsum(t * t) if n else f("nan")
        eps = s_hat - f(1)
        k = _f32(np.power, (eps * _f32(np.power, f(2), f(mu)))
                 / (f(1) - _f32(np.power, f(n_vocab), -eps)), f(1) / s_hat)
    # C's int(k); x86 gives INT_MIN for NaN and out-of-range values, then max(., 1)
    if not math.isfinite(k) or not -2.0 ** 31 <= k < 2.0 ** 31:
        return 1
    return max(int(k), 1)


def _f32(fn: Any, *args: Any) -> Any:
    return fn(*(np.asarray(a, dtype=np.float64) for a in args)).astype(np.float32)


def mirostat_v2_cut(p: np.ndarray, mu: float) -> int:
    """How many sorted candidates Mirostat 2.0 keeps: those before the first whose
    surprise ``-log2 p`` exceeds ``mu`` (at least one)."""
    with np.errstate(divide="ignore"):
        over = -_f32(np.log2, p) > np.float32(mu)
    return max(int(np.argmax(over)) if over.any() else len(p), 1)


def discrete_draw(p: np.ndarray, u: float | None) -> int:
    """``std::discrete_distribution`` on float probabilities ``p``: normalized in double,
    cumulative, the last set to 1, the first reaching u. libstdc++ draws nothing for one
    candidate (``u`` may then be None)."""
    if len(p) < 2:
        return 0
    pd = p.astype(np.float64)
    cum = np.cumsum(pd / np.cumsum(pd)[-1])
    cum[-1] = 1.0
    return min(int(np.searchsorted(cum, u, side="left")), len(p) - 1)


# --- the sampler ----------------------------------------------------------------------

class Sampler:
    """Samples token ids from logits with ``params``; remembers the recent tokens (for the
    penalties) and owns its random stream. Call ``accept`` for every token that enters
    the context (prompt included, as llama.cpp does) and ``sample`` for the next one."""

    def __init__(self, params: SamplerParams | None = None) -> None:
        self.params = params or SamplerParams()
        seed = self.params.seed
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little") % 0xFFFFFFFF
        self.seed: int = seed
        # std::mt19937(seed) and numpy's legacy seeding are the same init_genrand
        state = np.random.RandomState(seed).get_state()
        self._bits = np.random.MT19937()
        self._bits.state = {"bit_generator": "MT19937",
                            "state": {"key": state[1], "pos": state[2]}}
        n = self.params.repeat_last_n
        self._history: deque[int] = deque(maxlen=None if n < 0 else n)
        self._counts: Counter[int] = Counter()
        self.mu = 2.0 * self.params.mirostat_tau  # Mirostat's running target (float32)

    def uniform(self) -> float:
        """The next draw in [0, 1): ``std::uniform_real_distribution<double>(0, 1)``."""
        r1, r2 = (float(r) for r in self._bits.random_raw(2))
        u = (r1 + r2 * 4294967296.0) / 18446744073709551616.0
        return min(u, math.nextafter(1.0, 0.0))

    def accept(self, token: int) -> None:
        """Record a token that entered the context (for the penalties)."""
        if not self.params.penalties_on:
            return
        if self._history.maxlen is not None and len(self._history) == self._history.maxlen:
            old = self._history[0]
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._history.append(int(token))
        self._counts[int(token)] += 1

    def accept_all(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.accept(t)

    def reset(self) -> None:
        """Forget the token history and Mirostat's mu (the random stream continues)."""
        self._history.clear()
        self._counts.clear()
        self.mu = 2.0 * self.params.mirostat_tau

    def candidates(self, logits: np.ndarray) -> Candidates:
        """The candidate list the final draw picks from (the whole chain but the draw)."""
        p = self.params
        c = Candidates.from_logits(logits)
        if p.mirostat:
            apply_temperature(c, p.temp)
            return c
        if p.greedy and p.samplers == DEFAULT_SAMPLERS:  # nothing else changes the argmax
            if p.penalties_on:
                apply_penalties(c, self._counts, p.repeat_penalty, p.frequency_penalty,
                                p.presence_penalty)
            apply_temperature(c, p.temp)
            return c
        for step in p.samplers:
            if step == "penalties" and p.penalties_on:
                apply_penalties(c, self._counts, p.repeat_penalty, p.frequency_penalty,
                                p.presence_penalty)
            elif step == "top_k":
                apply_top_k(c, p.top_k)
            elif step == "typ_p":
                apply_typical(c, p.typical_p, p.min_keep)
            elif step == "top_p":
                apply_top_p(c, p.top_p, p.min_keep)
            elif step == "min_p":
                apply_min_p(c, p.min_p, p.min_keep)
            elif step == "temperature":
                apply_temperature(c, p.temp)
        return c

    def _mirostat(self, c: Candidates, n_vocab: int) -> int:
        """Mirostat's pick from the tempered candidates, and its update of mu."""
        p = _softmax_sorted(c)
        if self.params.mirostat == 1:
            keep = mirostat_v1_top_k(p, self.mu, n_vocab)
        else:
            keep = mirostat_v2_cut(p, self.mu)
        c.take(slice(0, keep), sorted=True)
        p = _glibc_softmax(c.logits)
        idx = discrete_draw(p, self.uniform() if len(c) > 1 else None)
        f = np.float32
        # glibc's log2f: the double result rounded (numpy's float32 log2 may differ by an ulp)
        surprise = f(-math.log2(p[idx])) if p[idx] > 0 else f("inf")
        self.mu = float(f(self.mu) - f(self.params.mirostat_eta) *
                        (surprise - f(self.params.mirostat_tau)))
        return int(c.ids[idx])

    def sample(self, logits: np.ndarray) -> int:
        """The next token id for ``logits`` (n_vocab,); does not ``accept`` it."""
        p = self.params
        if p.greedy and not p.penalties_on:
            # the chain would keep the first highest logit and draw it: the same token
            # without copying the logits and numbering the vocabulary (megabytes a token
            # on a large vocabulary)
            self.uniform()  # drawn even when greedy, keeping the stream aligned
            return int(np.argmax(logits))
        c = self.candidates(logits)
        if p.mirostat:
            return self._mirostat(c, int(np.size(logits)))
        u = self.uniform()  # drawn even when greedy, keeping the stream aligned
        return draw(c, u)
