"""Multi-head latent attention's per-head products (``mla.per_head``): every head's ``k_b``
(and ``v_b``) in one kernel call (``expert_products``, a head an expert every row chose)
gives each row the numbers of that head's own product of that row alone; and the model's
logits are those of the head-by-head loop.

The tiny deepseek2 reference keeps its per-head matrices in F16 (no integer kernel: the
loop runs); requantized to Q8_0 they take the one call.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.model import mla
from gguflm.model.batch import ALL, Part
from gguflm.quant.quantize_file import quantize_file


@pytest.fixture(scope="module")
def q8_model(reference: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    src = reference / "arch" / "deepseek2" / "tiny-deepseek2-f16.gguf"
    if not src.is_file():
        pytest.skip(f"{src} not found")
    out = tmp_path_factory.mktemp("mla") / "tiny-deepseek2-q8_0.gguf"
    quantize_file(src, out, "Q8_0", threads=2)
    return gguflm.load_model(out)


def _loop(mats: tuple, x: np.ndarray) -> np.ndarray:
    return np.stack([m.matmul(np.ascontiguousarray(x[:, h])) for h, m in enumerate(mats)],
                    axis=1)


@pytest.mark.parametrize("n", [1, 3, 40])
def test_every_head_in_one_call_gives_each_heads_own_product(q8_model, n: int) -> None:  # noqa: ANN001
    a = q8_model.blocks[0].attn
    assert a.k_b_all.usable and a.v_b_all.usable, (a.k_b_all.why, a.v_b_all.why)
    rng = np.random.default_rng(n)
    for mats, every, k in ((a.k_b, a.k_b_all, a.nope), (a.v_b, a.v_b_all, a.kv_lora)):
        x = rng.standard_normal((n, a.n_head, k)).astype(np.float32)
        x[:, :, :3] *= 30  # outliers: each row quantized on its own
        np.testing.assert_array_equal(mla.per_head(mats, every, x), _loop(mats, x))


def test_the_logits_are_the_head_by_head_loops(q8_model, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
                                               ) -> None:
    def run() -> np.ndarray:
        arena = q8_model.new_arena(32, 2)
        a, b = arena.slots
        out = [q8_model.forward_batch([Part(a, np.arange(3, 15), ALL)]),
               q8_model.forward_batch([Part(a, np.array([20]), ALL),
                                       Part(b, np.arange(5, 9), ALL)])]
        return np.concatenate(out)

    calls = []
    real = mla.per_head
    monkeypatch.setattr(mla, "per_head", lambda m, e, x: calls.append(e.usable) or real(m, e, x))
    got = run()
    assert calls and all(calls), calls
    monkeypatch.setattr(mla, "per_head", lambda m, e, x: _loop(m, x))
    np.testing.assert_array_equal(got, run())
