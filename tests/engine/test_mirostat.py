"""Mirostat 1 and 2 and the --samplers chain, checked against a line-by-line transcription
of llama.cpp's C++ (src/llama-sampler.cpp: llama_sampler_mirostat_apply and _v2, float
arithmetic; std::discrete_distribution as libstdc++ computes it), on random logits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gguflm.engine.params import sampler_params
from gguflm.engine.sampling import (
    Sampler,
    SamplerParams,
    SamplingError,
    discrete_draw,
    mirostat_v1_top_k,
    parse_samplers,
)

F = np.float32


def _softmax(logits: list[float]) -> list[np.float32]:
    mx = logits[0]
    ps = [F(math.exp(F(x - mx))) for x in logits]
    total = F(0)
    for p in ps:
        total = F(total + p)
    return [F(p / total) for p in ps]


def _discrete(ps: list[np.float32], u: float) -> int:
    # libstdc++: probabilities / their double sum, partial sums, the last set to 1
    total = 0.0
    for p in ps:
        total += float(p)
    cum, acc = [], 0.0
    for p in ps:
        acc += float(p) / total
        cum.append(acc)
    cum[-1] = 1.0
    return next(i for i, c in enumerate(cum) if c >= u)


class ReferenceMirostat:
    """llama.cpp's two Mirostat samplers, transcribed statement by statement."""

    def __init__(self, version: int, tau: float, eta: float, seed: int, n_vocab: int) -> None:
        self.version, self.tau, self.eta, self.n_vocab = version, F(tau), F(eta), n_vocab
        self.mu = F(2) * self.tau
        self.rng = Sampler(SamplerParams(seed=seed))  # its std::mt19937 and canonical doubles

    def sample(self, logits: np.ndarray, temp: float) -> int:
        ids = sorted(range(len(logits)), key=lambda i: (-float(logits[i]), i))
        lg = [F(F(logits[i]) / F(temp)) for i in ids]
        ps = _softmax(lg)
        if self.version == 1:
            sum_ti_bi, sum_ti_sq = F(0), F(0)
            for i in range(min(100 - 1, len(ps) - 1)):
                t_i = F(math.log(F(i + 2) / F(i + 1)))
                b_i = F(math.log(F(ps[i] / ps[i + 1])))
                sum_ti_bi = F(sum_ti_bi + F(t_i * b_i))
                sum_ti_sq = F(sum_ti_sq + F(t_i * t_i))
            s_hat = F(sum_ti_bi / sum_ti_sq)
            eps = F(s_hat - F(1))
            k = F(F(eps * F(2.0 ** float(self.mu))) / F(1 - F(float(self.n_vocab) ** -float(eps))))
            k = F(float(k) ** float(F(F(1) / s_hat)))
            n = max(int(k), 1)
        else:
            n = 0
            while n < len(ps) and not -math.log2(ps[n]) > self.mu:
                n += 1
            n = max(n, 1)
        ps = _softmax(lg[:n])
        idx = _discrete(ps, self.rng.uniform()) if n > 1 else 0
        e = F(F(-math.log2(ps[idx])) - self.tau)
        self.mu = F(self.mu - F(self.eta * e))
        return ids[idx]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("temp", [0.7, 1.0, 1.5])
def test_mirostat_matches_llama_cpps_arithmetic(version: int, temp: float) -> None:
    rng = np.random.default_rng(version * 10 + int(temp * 10))
    n_vocab = 300
    params = SamplerParams(temp=temp, mirostat=version, mirostat_tau=4.0, mirostat_eta=0.2,
                           seed=1234)
    ours = Sampler(params)
    ref = ReferenceMirostat(version, 4.0, 0.2, 1234, n_vocab)
    picks = []
    for _ in range(40):
        # Zipf-like logits, as a language model's are, with noise
        logits = (-1.1 * np.log(np.arange(1, n_vocab + 1)) + rng.normal(0, 0.5, n_vocab))
        logits = rng.permutation(logits).astype(np.float32)
        got, want = ours.sample(logits), ref.sample(logits, temp)
        assert got == want
        assert F(ours.mu) == ref.mu
        picks.append(got)
    assert len(set(picks)) > 5  # it really samples


def test_mirostat_steers_the_surprise_toward_tau() -> None:
    rng = np.random.default_rng(7)
    logits = np.sort(rng.normal(0, 3, 500)).astype(np.float32)
    for version in (1, 2):
        s = Sampler(SamplerParams(temp=1.0, mirostat=version, mirostat_tau=3.0,
                                  mirostat_eta=0.1, seed=5))
        mus = []
        for _ in range(400):
            s.sample(logits)
            mus.append(s.mu)
        # mu starts at 2 tau and settles where the average surprise is tau
        assert mus[0] != 6.0 and abs(np.mean(mus[-100:]) - mus[-1]) < 2.0
        s.reset()
        assert s.mu == 6.0


def test_mirostat_greedy_and_single_candidates_draw_nothing() -> None:
    logits = np.array([0.5, 3.0, 1.0, 2.9], dtype=np.float32)
    for version in (1, 2):
        s = Sampler(SamplerParams(temp=0.0, mirostat=version, seed=3))
        before = s._bits.state["state"]["pos"]
        assert s.sample(logits) == 1
        assert s._bits.state["state"]["pos"] == before  # libstdc++: one choice, no draw
        assert s.mu == pytest.approx(10.0 + 0.1 * 5.0)  # surprise 0: mu -= eta * (0 - tau)


def test_v1_top_k_estimate_is_bounded() -> None:
    p = np.array([1.0], dtype=np.float32)
    assert mirostat_v1_top_k(p, 10.0, 1000) == 1  # nothing to estimate from: NaN -> 1
    zipf = (1.0 / np.arange(1, 200)).astype(np.float32)
    zipf /= zipf.sum()
    small, large = mirostat_v1_top_k(zipf, 2.0, 200), mirostat_v1_top_k(zipf, 8.0, 200)
    assert 1 <= small < large  # a higher target surprise keeps more tokens


def test_discrete_draw_is_libstdcxx_lower_bound() -> None:
    p = np.array([0.25, 0.25, 0.5], dtype=np.float32)
    assert [discrete_draw(p, u) for u in (0.0, 0.25, 0.2500001, 0.5, 0.75, 0.999)] == \
        [0, 0, 1, 1, 2, 2]
    assert discrete_draw(np.array([1.0], dtype=np.float32), None) == 0


def test_mirostat_parameters_are_checked_and_named() -> None:
    assert sampler_params({"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.5}).mirostat == 2
    for bad in ({"mirostat": 3}, {"mirostat": 1.5}, {"mirostat_tau": float("nan")},
                {"mirostat_eta": "x"}):
        with pytest.raises(SamplingError, match=next(iter(bad))):
            sampler_params(bad)


def test_samplers_order_and_spellings() -> None:
    assert parse_samplers("penalties;top-k;TYP;nucleus;minp;temp") == \
        ("penalties", "top_k", "typ_p", "top_p", "min_p", "temperature")
    assert parse_samplers("edkypmxt")[0] == "penalties"  # --sampler-seq's letters
    with pytest.raises(SamplingError, match="unknown sampler"):
        sampler_params({"samplers": "top_k;bogus"})
    with pytest.raises(SamplingError) as e:  # an untrusted field: the message stays short
        sampler_params({"samplers": "x" * 100_000})
    assert len(str(e.value)) < 200
    with pytest.raises(SamplingError, match="at most 64"):
        sampler_params({"samplers": ["top_k"] * 65})
    logits = np.array([4.0, 3.9, 3.8, 0.0, -1.0], dtype=np.float32)
    # without temperature in the chain, temp 0 is not greedy (as in llama.cpp)
    only_k = Sampler(sampler_params({"samplers": "top_k", "top_k": 3, "temperature": 0.0,
                                     "seed": 1}))
    assert len(only_k.candidates(logits)) == 3
    picks = {only_k.sample(logits) for _ in range(50)}
    assert picks == {0, 1, 2}
    # min-p before top-k: a different list than the default order
    c = Sampler(sampler_params({"samplers": "min_p;top_k", "min_p": 0.5, "top_k": 1,
                                "seed": 1})).candidates(logits)
    assert c.ids.tolist() == [0]
    # the penalties after another step still find their tokens by id
    s = Sampler(sampler_params({"samplers": "top_k;penalties;temperature", "top_k": 3,
                                "repeat_penalty": 2.0, "temperature": 0.0, "seed": 1}))
    s.accept(0)
    assert s.sample(logits) == 1  # token 0's logit halved: 2.0 < 3.9
