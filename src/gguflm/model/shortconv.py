"""The gated short convolution (``layer.ShortConv``): the recurrent mixer of LFM2, as
llama.cpp's lfm2 graph (build_shortconv_block) and ggml-cpu's ssm_conv op compute it.

Per sequence of the batch, in position order from the slot's state (``Batch.
recurrent_state``): b * x after the kept l_cache - 1 values, the causal depthwise
convolution over each l_cache window (ggml's ssm_conv: the taps summed in order, in
float32), times c. Each output depends only on its sequence's last l_cache inputs, so the
numbers do not depend on how a prompt was cut into batches or on the other rows of a
batch; the new states are staged and committed with the positions (``Batch.advance``).
``forward`` runs it op by op (the reference path); the fused layers (``fused.short_conv``)
run the same kernels in two compiled calls and one more per further sequence
(``sequence``).
"""

from __future__ import annotations

import numpy as np

from . import ops
from .deltanet import (
    _conv_rows,  # ggml's ssm_conv, which the delta net's convolution is too
    conv_step,
)
from .layer import ShortConv

sequence = conv_step  # a sequence's convolution in one call: the fused layers' step


def causal_conv(x: np.ndarray, prev: np.ndarray, w: np.ndarray) -> tuple[np.ndarray,
                                                                          np.ndarray]:
    """ggml's ssm_conv without an activation: inputs x (T, C) after the kept ``prev``
    (d_conv - 1, C), taps w (C, d_conv) -> (conv (T, C), the new kept inputs (d_conv - 1,
    C))."""
    window = np.ascontiguousarray(np.concatenate([prev, x]), np.float32)  # (d_conv - 1 + T, C)
    out = np.empty((len(x), window.shape[1]), np.float32)
    _conv_rows(window, np.ascontiguousarray(w, np.float32), out)
    return out, window[len(window) - (w.shape[1] - 1):]


def forward(h: np.ndarray, s: ShortConv, batch: object) -> np.ndarray:
    """Normed input h (T, n_embd) -> (T, n_embd): out(c * conv(b * x)), each sequence of
    ``batch`` from its slot's state, staging the new states."""
    n = s.channels
    bcx = ops.linear(h, s.in_proj.w, s.in_proj.b)  # (T, 3 n_embd): [b | c | x]
    bx = bcx[:, :n] * bcx[:, 2 * n:]
    conv = np.empty((len(h), n), np.float32)
    for part, rows in batch.sequences():
        kept, _, new_kept, _ = batch.recurrent_state(s.index, part)
        conv[rows], new_kept[:] = causal_conv(bx[rows], kept, s.conv)
        batch.stage_state(s.index, part)
    y = bcx[:, n:2 * n] * conv
    return ops.linear(y, s.out.w, s.out.b)
