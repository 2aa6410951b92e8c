"""model/encoder: an encoder's bidirectional attention against its numpy twin, and
each text's numbers independent of the texts beside it."""

from __future__ import annotations

import numpy as np
import pytest

from gguflm.model.encoder import encoder_attention, encoder_attention_twin


def _inputs(lengths: list[int], heads: int, kv_heads: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    q = rng.standard_normal((n, heads, d)).astype(np.float32) * 2
    k = rng.standard_normal((n, kv_heads, d)).astype(np.float32) * 2
    v = rng.standard_normal((n, kv_heads, d)).astype(np.float32)
    return q, k, v, np.cumsum([0] + lengths).astype(np.int64)


@pytest.mark.parametrize("heads,kv_heads", [(12, 12), (8, 2)])
def test_matches_the_twin(heads: int, kv_heads: int) -> None:
    q, k, v, spans = _inputs([1, 17, 250, 3], heads, kv_heads, 32)
    out = np.full((len(q), heads, 32), np.nan, np.float32)
    encoder_attention(q, k, v, spans, 0.125, out)
    twin = encoder_attention_twin(q, k, v, spans, 0.125)
    assert np.abs(out - twin).max() < 2e-5 * np.abs(twin).max()


def test_a_text_does_not_see_the_others_and_keeps_its_numbers() -> None:
    q, k, v, spans = _inputs([40, 9, 77], 4, 4, 16, seed=1)
    together = np.empty((len(q), 4, 16), np.float32)
    encoder_attention(q, k, v, spans, 0.25, together)
    for a, b in zip(spans[:-1], spans[1:]):
        alone = np.empty((b - a, 4, 16), np.float32)
        encoder_attention(q[a:b], k[a:b], v[a:b], np.array([0, b - a], np.int64), 0.25, alone)
        assert np.array_equal(alone, together[a:b])


def test_layer_norm_and_gelu_match_numpy() -> None:
    from gguflm.model.encoder import layer_norm
    from gguflm.model.ops import gelu_tanh
    from gguflm.quant.glu import gelu

    rng = np.random.default_rng(2)
    x = (rng.standard_normal((37, 384)) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(384).astype(np.float32), rng.standard_normal(384).astype(np.float32)
    out = np.empty_like(x)
    layer_norm(x, w, b, 1e-12, out)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-12) * w + b
    assert np.abs(out - want).max() < 1e-5 * np.abs(want).max()
    gelu(x, out)
    assert np.abs(out - gelu_tanh(x)).max() < 1e-5 * np.abs(x).max()
    one = np.empty_like(x[:1])
    gelu(x[5:6].copy(), one)  # a row's numbers whatever the rows beside it
    assert np.array_equal(one[0], out[5])
