"""``gguflm inspect MODEL [--tensors] [--query TEXT] [--json]``: what a GGUF file holds."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

from . import CLIError
from .common import add_model_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "inspect", help="show a GGUF file's header, summary and metadata",
        description="Show a GGUF file's header, a model summary and its metadata "
                    "(arrays as type, length and first elements). MODEL is a path or a "
                    "known model name (pulled on first use).")
    add_model_argument(p)
    p.add_argument("--tensors", action="store_true",
                   help="also list every tensor: name, type, shape (ggml order), offset, size")
    p.add_argument("--query", metavar="TEXT",
                   help="only metadata keys containing TEXT (values shown in full)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: version, alignment, data_offset, metadata (full "
                        "values), tensors, summary")
    p.add_argument("--layers", action="store_true",
                   help="a grid of layers by tensor kind showing each tensor's type (the "
                        "quantization mix at a glance; coloured on a terminal)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import gguf
    from ..gguf.summary import summarize
    from .pull import resolve

    path = resolve(args.model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", gguf.GGUFWarning)
        f = gguf.open(path)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    with f:
        summary = summarize(f)
        summary["architecture_supported"] = _supported(summary["architecture"])
        summary["ignored_keys"] = _ignored_keys(summary["architecture"])
        summary["layers_path"] = _layers_path(f) if summary["architecture_supported"] else None
        if args.json:
            _print_json(f, summary, args.query, args)
        else:
            _print_text(f, summary, args)
            if args.layers:
                sys.stdout.write(_layer_grid(f, sys.stdout.isatty()))
    return 0


def _print_json(f: Any, summary: dict[str, Any], query: str | None,
                args: argparse.Namespace | None = None) -> None:
    from ..gguf.summary import to_json, type_name

    keys = [k for k in f.metadata if query is None or query in k]
    tensor_query = query if args is not None and args.tensors else None
    out = {
        "file": str(f.path),
        "version": f.version,
        "byte_order": "little" if f.byte_order == "<" else "big",
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "metadata": {k: to_json(f.metadata[k]) for k in keys},
        "metadata_types": {k: type_name(f.types[k]) for k in keys},
        "tensors": [
            {"name": t.name, "type": t.type.ggml_name, "shape": list(t.shape),
             "offset": t.offset, "nbytes": t.nbytes}
            for t in f.tensors.values() if tensor_query is None or tensor_query in t.name
        ],
        "summary": summary,
    }
    if args is not None and args.layers:
        out["layers"] = _layer_types(f)
    text = json.dumps(out, default=_json_default)  # all of it, or an error and nothing
    sys.stdout.write(text + "\n")


def _json_default(x: Any) -> Any:
    """numpy values that reached the output (``to_json`` converts the ones it knows)."""
    import numpy as np

    if isinstance(x, np.generic | np.ndarray):
        return x.tolist()
    raise TypeError(f"cannot write a {type(x).__name__} as JSON")


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def _params(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f} {unit} ({n:,})"
    return str(n)


def _print_text(f: Any, s: dict[str, Any], args: argparse.Namespace) -> None:
    from ..gguf.summary import format_value, printable, type_name
    from ..gguf.types import ArrayType

    out: list[str] = []
    order = "little-endian" if f.byte_order == "<" else "big-endian"
    out += [
        f"file:         {f.path}",
        f"size:         {f.file_size:,} bytes",
        *([f"shards:       {1 + len(f.shards)} files (split model), "
           f"{f.file_size + sum(x.file_size for x in f.shards):,} bytes in all"]
          if f.shards else []),
        f"version:      {f.version} ({order})",
        f"alignment:    {f.alignment}",
        f"data offset:  {f.data_offset}",
        f"tensors:      {len(f.tensors)}",
        f"metadata:     {len(f.metadata)} keys",
    ]
    for w in f.warnings:
        out.append(f"warning:      {w}")
    if args.query is None:
        out += ["", "summary"]
        rows = _summary_rows(s)
        width = max(len(k) for k, _ in rows)
        out += [f"  {k:<{width}}  {v}" for k, v in rows]

    keys = [k for k in f.metadata if args.query is None or args.query in k]
    # --query filters the tensors too when they are listed
    tensors = [t for t in f.tensors.values()
               if not args.tensors or args.query is None or args.query in t.name]
    if args.query is not None and not keys and not (args.tensors and tensors):
        raise CLIError(f"no metadata key {'or tensor name ' if args.tensors else ''}contains "
                       f"{args.query!r}")
    out += ["", f"metadata ({len(keys)} of {len(f.metadata)} keys)" if args.query is not None
            else "metadata"]
    kw = max((len(k) for k in keys), default=0)
    tw = max((len(type_name(f.types[k])) for k in keys), default=0)
    full = args.query is not None
    for k in keys:
        t = f.types[k]
        v = format_value(f.metadata[k], t, max_chars=None if full else 80)
        n = f" ({len(f.metadata[k])})" if isinstance(t, ArrayType) else ""
        out.append(f"  {k:<{kw}}  {type_name(t) + n:<{tw + 10}}  {v}")

    if args.tensors:
        count = (f"{len(tensors)} of {len(f.tensors)}" if len(tensors) != len(f.tensors)
                 else f"{len(f.tensors)}")
        out += ["", f"tensors ({count}; offsets relative to the data section at "
                f"{f.data_offset})"]
        nw = max((len(t.name) for t in tensors), default=4)
        out.append(f"  {'name':<{nw}}  {'type':<8} {'shape':<20} {'offset':>12}  {'bytes':>12}")
        for t in tensors:
            shape = "x".join(str(d) for d in t.shape) or "scalar"
            out.append(f"  {t.name:<{nw}}  {t.type.ggml_name:<8} {shape:<20} "
                       f"{t.offset:>12}  {t.nbytes:>12,}")
    # keys, names and strings from the file may hold terminal escapes: shown escaped
    sys.stdout.write("\n".join(printable(line) for line in out) + "\n")


def _supported(arch: Any) -> bool | None:
    """Whether gguflm's architecture registry runs ``arch`` (None: the file names none)."""
    if not isinstance(arch, str) or not arch:
        return None
    from ..model import archs

    return arch in archs.supported()


def _layers_path(f: Any) -> dict[str, Any]:
    """How gguflm runs the file's layers: ``{"compiled": bool, "detail": one line}``
    (``executor.Plan.describe``), or ``compiled`` None with the reason it does not load."""
    from ..gguf.errors import GGUFError
    from ..model import from_gguf
    from ..model.kv_cache import MAX_CHECKPOINTS

    try:
        model = from_gguf(f)
    except (GGUFError, ValueError) as e:
        return {"compiled": None, "detail": f"does not load: {e}"}
    out = {"compiled": model.plan.compiled, "detail": model.plan.describe()}
    kv, state = model.cache_bytes() if model.blocks else (None, 0)
    if kv is not None:  # what the cache holds (the metadata's count misses latent caches,
        out["kv_cache_bytes_per_token"] = kv  # layers sharing KV, blocks that do not run)
    if state:  # a hybrid: keys and values for its attention layers only, and a state
        out["recurrent_state_bytes"] = state
        out["recurrent_snapshots"] = MAX_CHECKPOINTS
    return out


def _ignored_keys(arch: Any) -> list[str]:
    """Metadata keys (without the ``{arch}.`` prefix) that the architecture's implementation
    ignores, as llama.cpp does (e.g. Phi-3's sliding window): its ``ignored_keys``."""
    if not _supported(arch):
        return []
    from ..model import archs

    return list(getattr(archs.get(arch), "ignored_keys", ()))


def _window_and_caps(s: dict[str, Any]) -> list[tuple[str, str]]:
    """Sliding-window and soft-capping rows, only for files that declare them."""
    rows = []
    if s.get("sliding_window") is not None:
        pattern = s.get("sliding_window_pattern")
        if isinstance(pattern, list):
            pattern = "".join("L" if p else "G" for p in pattern) + " (L: local, G: global)"
        ignored = "attention.sliding_window" in s.get("ignored_keys", ())
        rows.append(("sliding window", f"{s['sliding_window']} tokens"
                     + (f", pattern {pattern}" if pattern is not None else "")
                     + (f" (ignored by {s['architecture']}, as in llama.cpp)" if ignored
                        else "")))
    caps = [f"{name} {s[key]:g}" for name, key in (("attention", "attn_logit_softcapping"),
                                                   ("final logits", "final_logit_softcapping"))
            if isinstance(s.get(key), int | float)]
    if caps:
        rows.append(("soft-capping", ", ".join(caps)))
    return rows


def _expert_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """A mixture of experts' counts and the parameters a token reads; none when dense."""
    if s.get("expert_count") is None:
        return []
    return [("experts", f"{s['expert_count']} ({s['expert_used_count']} used per token)"),
            ("active params", f"{_params(s['active_params'])} per token")]


def _encoder_path(arch: str) -> str | None:
    """What an encoder architecture runs (its ``forward_path``), or None for a decoder."""
    from ..model import archs

    cls = archs.get(arch)
    return getattr(cls, "forward_path", None) if cls.is_encoder else None


def _summary_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    def val(x: Any) -> str:
        return "-" if x is None else str(x)

    arch = val(s["architecture"])
    encoder = _encoder_path(s["architecture"]) if s.get("architecture_supported") else None
    if encoder:
        arch += f" (runs in gguflm: {encoder}; embeddings only)"
    elif s.get("architecture_supported") is not None:
        arch += (" (runs in gguflm)" if s["architecture_supported"]
                 else " (gguflm cannot run it: see `gguflm archs`)")
    rows = [
        ("architecture", arch),
        ("name", val(s["name"])),
        ("parameters", _params(s["n_params"])),
        ("tensor bytes", _mb(s["n_bytes"])),
        ("bits per weight", "-" if s["bits_per_weight"] is None
         else f"{s['bits_per_weight']:.2f}"),
        ("file type", "-" if s["file_type"] is None
         else f"{s['file_type_name'] or 'unknown'} ({s['file_type']})"),
    ]
    mix = s["tensor_types"]
    for i, (name, m) in enumerate(mix.items()):
        rows.append(("tensor types" if i == 0 else "",
                     f"{name:<8} {m['count']:>4} tensors  {_mb(m['nbytes']):>12}"))
    heads = f"{val(s['head_count'])} / {val(s['head_count_kv'])}"
    rows += [
        ("context length", val(s["context_length"])),
        ("embedding", val(s["embedding_length"])),
        ("layers", val(s["block_count"])),
        ("heads / kv heads", heads),
        ("head dim", val(s["head_dim"])),
        ("attention", val(s.get("attention"))),
        *_window_and_caps(s),
        ("feed forward", val(s["feed_forward_length"])),
        *_expert_rows(s),
        ("vocab size", val(s["vocab_size"])),
        ("tokenizer", f"{val(s['tokenizer_model'])} (pre: {val(s['tokenizer_pre'])})"),
    ]
    if s.get("layers_path") is not None and not encoder:  # the architecture row says it
        rows.append(("layers run", s["layers_path"]["detail"]))
    special = s["special_tokens"]
    toks = [f"{k} {v['id']}" + (f" {v['token']!r}" if v["token"] is not None else "")
            for k, v in special.items()]
    rows.append(("special tokens", ", ".join(toks) if toks else "-"))
    rows.append(("chat template", f"yes ({s['chat_template_chars']} chars)"
                 if s["chat_template"] else "no"))
    path = s.get("layers_path") or {}
    kv = path.get("kv_cache_bytes_per_token", s["kv_cache_bytes_per_token"])
    if kv and not encoder:
        rows.append(("KV cache (f16)", f"{kv:,} bytes/token"
                     + (" (attention layers)" if "recurrent_state_bytes" in path else "")))
    if path.get("recurrent_state_bytes"):
        rows.append(("recurrent state", f"{path['recurrent_state_bytes']:,} bytes/sequence "
                     f"(f32; plus up to {path['recurrent_snapshots']} snapshots of it)"))
    if s["output_tied"] is not None and not encoder:
        rows.append(("output", "tied to token_embd" if s["output_tied"] else "output.weight"))
    for i, problem in enumerate(s.get("problems", ())):  # keys of the wrong type, left out
        rows.append(("problems" if i == 0 else "", problem))
    return rows


# --- inspect --layers: the type of each layer's tensors ---------------------------------------

def _layer_types(f: Any) -> dict[str, Any]:
    """{"layers": [{kind: type}, ...] per block, "other": {name: type}} for the tensors
    named ``blk.N.<kind>`` (kind without ``.weight``) and the rest."""
    layers: dict[int, dict[str, str]] = {}
    other: dict[str, str] = {}
    for t in f.tensors.values():
        parts = t.name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
            layers.setdefault(int(parts[1]), {})[parts[2].removesuffix(".weight")] = \
                t.type.ggml_name
        else:
            other[t.name] = t.type.ggml_name
    n = max(layers) + 1 if layers else 0
    return {"layers": [layers.get(i, {}) for i in range(n)], "other": other}


# a colour per precision, so the mix shows: 8+ bits green, 6 cyan, 5 blue, 4 yellow, less red
_COLOURS = (("F32", "2"), ("F16", "37"), ("BF16", "37"), ("Q8", "32"), ("Q6", "36"),
            ("Q5", "34"), ("Q4", "33"), ("IQ4", "33"), ("MXFP4", "33"), ("Q3", "31"),
            ("IQ3", "31"), ("Q2", "35"), ("IQ2", "35"), ("IQ1", "35"), ("TQ", "35"))


def _colour(type_name: str, text: str) -> str:
    code = next((c for prefix, c in _COLOURS if type_name.startswith(prefix)), "0")
    return f"\033[{code}m{text}\033[0m"


def _layer_grid(f: Any, colour: bool) -> str:
    """Layers x tensor kinds, each cell the tensor's type; 1-D tensors (norms, biases),
    which llama.cpp never quantizes, are summarized below the grid."""
    data = _layer_types(f)
    if not data["layers"]:
        return "\nlayers: none (no blk.N tensors)\n"
    kinds: list[str] = []
    for layer in data["layers"]:
        for kind in layer:
            if kind not in kinds:
                kinds.append(kind)
    dims = {}
    for t in f.tensors.values():
        parts = t.name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk":
            dims[parts[2].removesuffix(".weight")] = len(t.shape)
    grid = [k for k in kinds if dims.get(k, 2) >= 2]
    flat = sorted({layer[k] for layer in data["layers"] for k in kinds if k not in grid
                   and k in layer})
    widths = [max(len(k), *(len(layer.get(k, "-")) for layer in data["layers"])) for k in grid]
    lines = ["", "layers (tensor types; rows: blk.N)",
             "  layer  " + "  ".join(k.ljust(w) for k, w in zip(grid, widths))]
    for i, layer in enumerate(data["layers"]):
        cells = []
        for k, w in zip(grid, widths):
            t = layer.get(k, "-")
            cells.append(_colour(t, t.ljust(w)) if colour and t != "-" else t.ljust(w))
        lines.append(f"  {i:5d}  " + "  ".join(cells))
    if flat:
        lines.append(f"  1-D tensors ({', '.join(k for k in kinds if k not in grid)}): "
                     f"{', '.join(flat)}")
    if data["other"]:
        lines.append("  other: " + ", ".join(f"{n} {t}" for n, t in data["other"].items()))
    return "\n".join(lines) + "\n"
