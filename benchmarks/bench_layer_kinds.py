"""The newer layer kinds at real size against llama-bench: pp128, pp512, tg32, engines alternating.

    .venv/bin/python benchmarks/bench_layer_kinds.py --llama-bin DIR
        [--kinds lfm2,granitehybrid,deepseek2] [--shape real|small] [--type Q4_K_M]
        [-r 3] [-t 2] [--work DIR] [--seed N]

One random-weight file per layer kind, of a published model's shape:

- ``lfm2``: gated short convolutions (LFM2-1.2B: n_embd 2048, 16 layers, attention on
  layers 2, 5, 8, 10, 12, 14 with 32 heads of 64 and 8 KV heads, the other ten short
  convolutions over 3 taps; SwiGLU 8192, the converter's adjusted 12288; 65536 tokens;
  tied).
- ``granitehybrid``: Mamba2 (Granite-4.0-H-1B: n_embd 1536, 40 layers, attention without
  RoPE on layers 5, 15, 25, 35 with 12 heads of 128 and 4 KV heads, the other 36 Mamba2
  with 48 heads of 64, d_state 128, one group, conv 4; a dense SwiGLU 4096 in every layer,
  as that model has; 100352 tokens; tied).
- ``deepseek2``: multi-head latent attention with DeepSeek-V3's per-head sizes (q LoRA
  1536, kv LoRA 512, 128 nope + 64 rope key dims, 128 value dims) at about 1.7B: n_embd
  2048, 24 layers of 16 heads, YaRN as V3; untied, 129280 tokens. The FFN is a dense
  SwiGLU 5632 in every layer (``leading_dense_block_count`` = all of them, as V3's first
  three): no DeepSeek MoE this small is published, the experts' speed is
  ``bench_moe.py``'s to measure, and with random routers a MoE's prompt speed would turn
  on which experts the tokens happen to pick. The expert keys stay as the tiny reference
  has them (llama.cpp requires them; no layer uses them).

Each file copies the metadata layout of the kind's tiny reference model
(shared/reference/arch/<kind>/: the keys llama.cpp's converter writes, in its order) with
the sizes scaled, and its tokenizer padded with control tokens to the real vocabulary; it
is written in F16 one tensor at a time (norms, biases, convolution taps and Mamba2's A and
D in F32, as the converter leaves them), requantized with llama.cpp's ``llama-quantize``
(the F16 file then deleted), and timed with ``gguflm bench --json`` and ``llama-bench -o
json`` in turn (``bench_size.bench``). Weights: norms near 1, matrices std 1/sqrt(fan-in),
embeddings std 1, Mamba2's A in [-2, -0.5] and dt bias near 0, so activations stay
finite. ``--shape small`` makes small files of the same layouts (seconds) to try the
script out. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_qwen35 import padded_tokenizer  # noqa: E402
from bench_size import bench, requantized  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ARCH = REPO.parent / "shared" / "reference" / "arch"

SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    "lfm2": {
        "real": dict(n_embd=2048, n_layer=16, attn=(2, 5, 8, 10, 12, 14), n_head=32, n_kv=8,
                     n_ff=8192, vocab=65536, l_cache=3),
        "small": dict(n_embd=512, n_layer=6, attn=(2, 4), n_head=8, n_kv=4, n_ff=1024,
                      vocab=8192, l_cache=3)},
    "granitehybrid": {
        "real": dict(n_embd=1536, n_layer=40, attn=(5, 15, 25, 35), n_head=12, n_kv=4,
                     head_dim=128, n_ff=4096, vocab=100352, ssm_heads=48, d_state=128,
                     n_group=1, d_conv=4),
        "small": dict(n_embd=512, n_layer=5, attn=(2,), n_head=4, n_kv=2, head_dim=128,
                      n_ff=1024, vocab=8192, ssm_heads=16, d_state=64, n_group=1, d_conv=4)},
    "deepseek2": {
        "real": dict(n_embd=2048, n_layer=24, n_head=16, q_lora=1536, kv_lora=512, rope=64,
                     nope=128, v_head=128, n_ff=5632, vocab=129280),
        "small": dict(n_embd=512, n_layer=3, n_head=4, q_lora=384, kv_lora=512, rope=64,
                      nope=128, v_head=128, n_ff=1024, vocab=8192)},
}


def lfm2(s: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """(metadata values that replace the tiny reference's, {tensor: numpy shape})."""
    e, hd = s["n_embd"], s["n_embd"] // s["n_head"]
    md = {"block_count": s["n_layer"], "embedding_length": e, "feed_forward_length": s["n_ff"],
          "attention.head_count": s["n_head"], "vocab_size": s["vocab"],
          "attention.head_count_kv": np.array([s["n_kv"] if i in s["attn"] else 0
                                               for i in range(s["n_layer"])], np.int32),
          "shortconv.l_cache": s["l_cache"]}
    t = {"token_embd.weight": (s["vocab"], e), "token_embd_norm.weight": (e,)}
    for i in range(s["n_layer"]):
        layer = {**_glu(e, s["n_ff"]), "attn_norm.weight": (e,)}
        if i in s["attn"]:
            q, kv = s["n_head"] * hd, s["n_kv"] * hd
            layer |= {"attn_q.weight": (q, e), "attn_k.weight": (kv, e),
                      "attn_v.weight": (kv, e), "attn_output.weight": (e, q),
                      "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)}
        else:
            layer |= {"shortconv.conv.weight": (e, s["l_cache"]),
                      "shortconv.in_proj.weight": (3 * e, e),
                      "shortconv.out_proj.weight": (e, e)}
        t |= {f"blk.{i}.{k}": v for k, v in layer.items()}
    return md, t


def granitehybrid(s: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """As ``lfm2``: Granite 4.0-H with a dense FFN (the converter writes ``expert_count``
    0 and the shared MLP's size for a model without experts)."""
    e, hd, heads = s["n_embd"], s["head_dim"], s["ssm_heads"]
    d_inner, gn = 2 * e, s["n_group"] * s["d_state"]
    md = {"block_count": s["n_layer"], "embedding_length": e, "feed_forward_length": s["n_ff"],
          "attention.head_count": s["n_head"], "vocab_size": s["vocab"],
          "attention.head_count_kv": np.array([s["n_kv"] if i in s["attn"] else 0
                                               for i in range(s["n_layer"])], np.int32),
          "expert_count": 0, "expert_used_count": 0,
          "expert_shared_feed_forward_length": s["n_ff"], "rope.dimension_count": hd,
          "attention.scale": 1.0 / hd, "ssm.conv_kernel": s["d_conv"],
          "ssm.state_size": s["d_state"], "ssm.group_count": s["n_group"],
          "ssm.inner_size": d_inner, "ssm.time_step_rank": heads}
    t = {"output_norm.weight": (e,), "token_embd.weight": (s["vocab"], e)}
    for i in range(s["n_layer"]):
        layer = {**_glu(e, s["n_ff"]), "attn_norm.weight": (e,)}
        if i in s["attn"]:
            q, kv = s["n_head"] * hd, s["n_kv"] * hd
            layer |= {"attn_q.weight": (q, e), "attn_k.weight": (kv, e),
                      "attn_v.weight": (kv, e), "attn_output.weight": (e, q)}
        else:
            conv = d_inner + 2 * gn
            layer |= {"ssm_in.weight": (2 * d_inner + 2 * gn + heads, e),
                      "ssm_conv1d.weight": (conv, s["d_conv"]), "ssm_conv1d.bias": (conv,),
                      "ssm_dt.bias": (heads,), "ssm_a": (heads, 1), "ssm_d": (heads, 1),
                      "ssm_norm.weight": (s["n_group"], d_inner // s["n_group"]),
                      "ssm_out.weight": (e, d_inner)}
        t |= {f"blk.{i}.{k}": v for k, v in layer.items()}
    return md, t


def deepseek2(s: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """As ``lfm2``: MLA with the absorbed layout (``attn_k_b``, ``attn_v_b``), every
    layer's FFN dense."""
    e, h, kv_lora, rope = s["n_embd"], s["n_head"], s["kv_lora"], s["rope"]
    md = {"block_count": s["n_layer"], "embedding_length": e, "feed_forward_length": s["n_ff"],
          "attention.head_count": h, "vocab_size": s["vocab"],
          "leading_dense_block_count": s["n_layer"], "attention.q_lora_rank": s["q_lora"],
          "attention.kv_lora_rank": kv_lora, "attention.key_length": kv_lora + rope,
          "attention.value_length": kv_lora,
          "attention.key_length_mla": s["nope"] + rope,
          "attention.value_length_mla": s["v_head"], "rope.dimension_count": rope}
    t = {"output.weight": (s["vocab"], e), "output_norm.weight": (e,),
         "token_embd.weight": (s["vocab"], e)}
    for i in range(s["n_layer"]):
        layer = {"attn_k_b.weight": (h, kv_lora, s["nope"]),
                 "attn_kv_a_mqa.weight": (kv_lora + rope, e), "attn_kv_a_norm.weight": (kv_lora,),
                 "attn_norm.weight": (e,), "attn_output.weight": (e, h * s["v_head"]),
                 "attn_q_a.weight": (s["q_lora"], e), "attn_q_a_norm.weight": (s["q_lora"],),
                 "attn_q_b.weight": (h * (s["nope"] + rope), s["q_lora"]),
                 "attn_v_b.weight": (h, s["v_head"], kv_lora), **_glu(e, s["n_ff"])}
        t |= {f"blk.{i}.{k}": v for k, v in layer.items()}
    return md, t


def _glu(e: int, ff: int) -> dict[str, tuple[int, ...]]:
    return {"ffn_down.weight": (e, ff), "ffn_gate.weight": (ff, e), "ffn_norm.weight": (e,),
            "ffn_up.weight": (ff, e)}


LAYOUTS = {"lfm2": lfm2, "granitehybrid": granitehybrid, "deepseek2": deepseek2}


def _f32(name: str, shape: tuple[int, ...]) -> bool:
    """The tensors the converter leaves in F32: vectors, norms, convolution taps, A and D."""
    return (len(shape) == 1 or "conv1d" in name or "shortconv.conv" in name
            or name.endswith(("ssm_a", "ssm_d", "_norm.weight")))


def values(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The tensor's float32 values: norms and D near 1, A in [-2, -0.5], biases near 0,
    matrices (and convolution taps) std 1/sqrt(fan-in), the embedding std 1."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("ssm_a"):
        return -rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if name.endswith(".bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if len(shape) == 1 or name.endswith(("ssm_d", "_norm.weight")):
        return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    std = 1.0 if name == "token_embd.weight" else 1 / np.sqrt(shape[-1])
    return (std * rng.standard_normal(shape, np.float32)).astype(np.float32)


def write(path: Path, kind: str, shape: str, seed: int) -> None:
    """The random-weight file of ``kind`` and ``shape`` at ``path`` (F16, one tensor at a
    time): the tiny reference's metadata with the layout's values, then the tensors."""
    from gguflm.gguf.reader import GGUFFile
    from gguflm.gguf.types import GGMLType, ValueType
    from gguflm.gguf.writer import GGUFWriter

    src = GGUFFile(ARCH / kind / f"tiny-{kind}-f16.gguf")
    md, tensors = LAYOUTS[kind](SHAPES[kind][shape])
    md = {f"{kind}.{k}": v for k, v in md.items()} | {"general.name": f"bench-{kind}-{shape}"}
    w = GGUFWriter(path)
    tokenizer_done = False
    for key, value in src.metadata.items():
        if key.startswith("tokenizer."):
            if not tokenizer_done:
                padded_tokenizer(w, SHAPES[kind][shape]["vocab"], src)
                tokenizer_done = True
            continue
        w.add(key, md.pop(key, value), src.types[key])
    for key, value in md.items():  # keys the tiny reference lacks
        w.add(key, value, ValueType.UINT32 if isinstance(value, int) else None)
    for name, shp in tensors.items():
        small = _f32(name, shp)

        def make(name: str = name, shp: tuple[int, ...] = shp, small: bool = small) -> bytes:
            x = values(name, shp, seed)
            return x.tobytes() if small else x.astype(np.float16).tobytes()

        w.add_tensor(name, make, type=GGMLType.F32 if small else GGMLType.F16,
                     shape=tuple(reversed(shp)))
    w.write()


def make(kind: str, shape: str, qtype: str, args: argparse.Namespace) -> Path:
    """The requantized file (made once, kept in ``--work``)."""
    stem = Path(args.work) / f"{kind}-{shape}-s{args.seed}"
    return requantized(Path(f"{stem}-f16.gguf"), Path(f"{stem}-{qtype}.gguf"), qtype, args,
                       lambda f16: write(f16, kind, shape, args.seed), drop_f16=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, help="folder with llama-bench, llama-quantize")
    ap.add_argument("--kinds", default=",".join(SHAPES))
    ap.add_argument("--shape", default="real", choices=("real", "small"))
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "gguflm" / "big"))
    ap.add_argument("--make-only", action="store_true", help="write the files, time nothing")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    if unknown := [k for k in kinds if k not in SHAPES]:
        ap.error(f"unknown kind {unknown[0]!r} (known: {', '.join(SHAPES)})")
    if args.rounds < 1:
        ap.error("-r must be at least 1")
    print("model                        medians: gguflm / llama.cpp tokens/s (ratio)")
    for kind in kinds:
        path = make(kind, args.shape, args.type, args)
        if args.make_only:
            print(path, flush=True)
        else:
            bench(path, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
