"""Sampling: each filter against its definition, llama.cpp's order and defaults, the RNG.

Logits are random (seeded) inputs; expected results are computed here from each filter's
definition in float64, independently of the implementation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gguflm.engine.sampling import (
    Candidates,
    Sampler,
    SamplerParams,
    SamplingError,
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    apply_typical,
    draw,
)

OFF = dict(top_k=0, top_p=1.0, min_p=0.0)  # every filter off: only temperature and the draw


def _logits(n: int = 200, seed: int = 0, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def test_defaults_are_llama_cpp_common_params_sampling() -> None:
    p = SamplerParams()
    assert (p.temp, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (p.repeat_penalty, p.repeat_last_n, p.frequency_penalty, p.presence_penalty) == (
        1.0, 64, 0.0, 0.0)
    assert p.min_keep == 0 and not p.penalties_on and not p.greedy


@pytest.mark.parametrize("field,value", [
    ("temp", float("nan")), ("temp", float("inf")), ("top_k", 1.5), ("top_p", 1.5),
    ("top_p", -0.1), ("min_p", 2.0), ("typical_p", -1.0), ("repeat_penalty", 0.0),
    ("repeat_penalty", -1.0), ("repeat_last_n", -2), ("frequency_penalty", float("nan")),
    ("min_keep", -1), ("seed", -1), ("seed", 2**32), ("temp", "hot"),
])
def test_invalid_values_are_named(field: str, value: object) -> None:
    with pytest.raises(SamplingError, match=field):
        SamplerParams(**{field: value})


# --- the RNG ------------------------------------------------------------------------------

def test_rng_is_std_mt19937() -> None:
    # The C++ standard requires the 10000th output of a default-seeded (5489) std::mt19937
    # to be 4123659995.
    s = Sampler(SamplerParams(seed=5489))
    assert int(s._bits.random_raw(10000)[-1]) == 4123659995


def test_uniform_matches_libstdcxx() -> None:
    # std::uniform_real_distribution<double>(0, 1) over std::mt19937(42), printed by a
    # program compiled with g++ (libstdc++), %.17g.
    expected = [0.79654298428784598, 0.18343478789336848, 0.77969099761266125,
                0.59685016158005655, 0.44583275754843343]
    s = Sampler(SamplerParams(seed=42))
    assert [s.uniform() for _ in expected] == expected


def test_same_seed_same_tokens_and_random_seed_is_recorded() -> None:
    logits = _logits(500, scale=1.0)

    def run(seed: int | None) -> tuple[int, list[int]]:
        s = Sampler(SamplerParams(seed=seed, repeat_penalty=1.1))
        out = []
        for _ in range(60):
            out.append(s.sample(logits))
            s.accept(out[-1])
        return s.seed, out

    assert run(7) == run(7)
    assert run(7)[1] != run(8)[1]
    seed, tokens = run(None)
    assert run(seed) == (seed, tokens)


# --- each filter against its definition ---------------------------------------------------

def test_top_k() -> None:
    lg = _logits()
    c = Candidates.from_logits(lg)
    apply_top_k(c, 7)
    assert c.sorted
    assert list(c.ids) == list(np.argsort(-lg)[:7])
    assert np.all(np.diff(c.logits) <= 0)
    for k in (0, -1, 500):  # <= 0: off; more than the vocabulary: everything
        c = Candidates.from_logits(lg)
        apply_top_k(c, k)
        assert sorted(c.ids) == list(range(lg.size))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.95])
def test_top_p(p: float) -> None:
    lg = _logits()
    probs = _softmax(lg)
    order = np.argsort(-probs)
    cum = np.cumsum(probs[order])
    assert np.min(np.abs(cum - p)) > 1e-5  # no boundary case where float32 could tip it
    m = int(np.argmax(cum >= p)) + 1  # the smallest prefix whose mass reaches p
    c = Candidates.from_logits(lg)
    apply_top_p(c, p, 0)
    assert list(c.ids) == list(order[:m])
    c = Candidates.from_logits(lg)
    apply_top_p(c, p, m + 3)  # min_keep wins
    assert len(c) == m + 3


@pytest.mark.parametrize("p", [0.01, 0.05, 0.3])
def test_min_p(p: float) -> None:
    lg = _logits()
    probs = _softmax(lg)
    keep = probs >= p * probs.max()
    assert np.min(np.abs(probs / probs.max() - p)) > 1e-5
    c = Candidates.from_logits(lg)
    apply_min_p(c, p, 0)
    assert set(c.ids) == set(np.flatnonzero(keep))
    c = Candidates.from_logits(lg)
    apply_top_k(c, 100)  # sorted input: llama.cpp's sorted path, same set
    apply_min_p(c, p, 0)
    assert set(c.ids) == set(np.flatnonzero(keep))


@pytest.mark.parametrize("p", [0.2, 0.6, 0.9])
def test_typical_p(p: float) -> None:
    lg = _logits(scale=1.5)
    probs = _softmax(lg)
    entropy = -(probs * np.log(probs)).sum()
    order = np.argsort(np.abs(-np.log(probs) - entropy), kind="stable")
    cum = np.cumsum(probs[order])
    assert np.min(np.abs(cum - p)) > 1e-5
    m = int(np.argmax(cum > p)) + 1
    c = Candidates.from_logits(lg)
    apply_typical(c, p, 0)
    assert list(c.ids) == list(order[:m])


def test_penalties_follow_the_definition() -> None:
    lg = np.array([2.0, -1.0, 0.5, 3.0, -2.0, 1.0], np.float32)
    history = [0, 1, 1, 3, 3, 3, 5, 2]  # with repeat_last_n=6 the first two drop out
    params = SamplerParams(temp=1.0, repeat_penalty=1.5, repeat_last_n=6,
                           frequency_penalty=0.25, presence_penalty=0.5, seed=1, **OFF)
    s = Sampler(params)
    s.accept_all(history)
    counts = {t: history[-6:].count(t) for t in set(history[-6:])}
    expected = lg.astype(np.float64).copy()
    for t, n in counts.items():
        x = expected[t]
        expected[t] = (x / 1.5 if x > 0 else x * 1.5) - (n * 0.25 + 0.5)
    c = s.candidates(lg)
    got = np.empty(lg.size)
    got[c.ids] = c.logits
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert 0 not in counts and got[0] == lg[0]  # outside the window: untouched


def test_penalties_off_and_window_zero_record_nothing() -> None:
    s = Sampler(SamplerParams(repeat_penalty=1.3, repeat_last_n=0))
    s.accept_all([1, 1, 1])
    c = Candidates.from_logits(np.ones(3, np.float32))
    apply_penalties(c, s._counts, 1.3, 0.0, 0.0)
    assert list(c.logits) == [1.0, 1.0, 1.0]


def test_temperature_scales_and_greedy_keeps_the_argmax() -> None:
    lg = _logits()
    c = Candidates.from_logits(lg)
    apply_temperature(c, 0.5)
    np.testing.assert_array_equal(c.logits, lg / np.float32(0.5))
    c = Candidates.from_logits(lg)
    apply_temperature(c, 0.0)
    assert list(c.ids) == [int(np.argmax(lg))]


def test_greedy_sampling_is_argmax_after_penalties() -> None:
    lg = np.array([1.0, 5.0, 4.0, -3.0], np.float32)
    for temp in (0.0, -1.0):
        s = Sampler(SamplerParams(temp=temp, seed=3))
        assert [s.sample(lg) for _ in range(5)] == [1] * 5
    s = Sampler(SamplerParams(temp=0.0, repeat_penalty=2.0))
    s.accept(1)  # 5 / 2 = 2.5 < 4
    assert s.sample(lg) == 2


def test_greedy_shortcut_equals_the_chain_and_keeps_the_stream() -> None:
    """Greedy without penalties takes the argmax directly: the token the whole chain (copy,
    temperature 0, draw) gives, ties and NaN included, and one uniform draw per token as
    before, so that a seeded request's later sampled tokens do not move."""
    rng = np.random.default_rng(4)
    cases = [rng.standard_normal(5000).astype(np.float32),
             np.array([1, 3, 3, 2], np.float32), np.array([1, 3, np.nan, 3], np.float32),
             np.full(6, -np.inf, np.float32)]
    s, ref = Sampler(SamplerParams(temp=0.0, seed=9)), Sampler(SamplerParams(temp=0.0, seed=9))
    for lg in cases:
        with np.errstate(invalid="ignore"):
            assert s.sample(lg) == draw(ref.candidates(lg), ref.uniform())
    assert s.uniform() == ref.uniform()


# --- the chain: order and the draw --------------------------------------------------------

def test_min_p_sees_logits_before_temperature() -> None:
    # log(0.05) = -3.0: token 3 (-3.5) is cut. Had temperature 2 come first, the logits
    # would be halved and all four would pass.
    lg = np.array([0.0, -1.0, -2.0, -3.5], np.float32)
    s = Sampler(SamplerParams(temp=2.0, top_k=0, top_p=1.0, min_p=0.05))
    assert sorted(s.candidates(lg).ids) == [0, 1, 2]


def test_penalties_come_before_top_k() -> None:
    lg = np.array([10.0, 9.0, 1.0], np.float32)
    s = Sampler(SamplerParams(top_k=1, repeat_penalty=100.0, seed=0))
    s.accept(0)  # 10 / 100 = 0.1: token 1 is now the top-1
    assert list(s.candidates(lg).ids) == [1]


def test_default_chain_equals_the_filters_in_llama_cpp_order() -> None:
    lg = _logits(1000, seed=4, scale=2.0)
    p = SamplerParams(top_k=50, top_p=0.8, min_p=0.02, typical_p=0.95, temp=0.7)
    c = Candidates.from_logits(lg)
    apply_top_k(c, p.top_k)
    apply_typical(c, p.typical_p, 0)
    apply_top_p(c, p.top_p, 0)
    apply_min_p(c, p.min_p, 0)
    apply_temperature(c, p.temp)
    got = Sampler(p).candidates(lg)
    assert list(got.ids) == list(c.ids)
    np.testing.assert_array_equal(got.logits, c.logits)


def test_draw_walks_the_cumulative_distribution() -> None:
    c = Candidates(np.array([7, 3, 9]), np.log(np.array([0.5, 0.3, 0.2], np.float32)))
    assert draw(c, 0.0) == 7
    assert draw(c, 0.49) == 7
    assert draw(c, 0.51) == 3
    assert draw(c, 0.79) == 3
    assert draw(c, 0.81) == 9
    assert draw(c, math.nextafter(1.0, 0.0)) == 9


def test_sample_frequencies_follow_softmax_of_logits_over_temperature() -> None:
    lg = np.array([1.0, 0.0, -0.5, 2.0, -3.0], np.float32)
    temp, n = 1.7, 20000
    s = Sampler(SamplerParams(temp=temp, seed=11, **OFF))
    counts = np.bincount([s.sample(lg) for _ in range(n)], minlength=lg.size)
    expected = _softmax(lg / temp) * n
    # chi-square with 4 degrees of freedom: 18.5 is its 0.999 quantile
    assert ((counts - expected) ** 2 / expected).sum() < 18.5
