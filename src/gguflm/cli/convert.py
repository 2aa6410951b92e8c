"""``gguflm convert HF_DIR [--outfile OUT] [--outtype TYPE]``: a Hugging Face checkpoint to the
GGUF file llama.cpp's ``convert_hf_to_gguf.py`` writes for it, without torch."""

from __future__ import annotations

import argparse
import sys
import time

OUTTYPES = ("f32", "f16", "bf16", "q8_0", "auto")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert", help="convert a Hugging Face checkpoint folder to GGUF",
        description="Write the GGUF file llama.cpp's convert_hf_to_gguf.py writes for the "
                    "checkpoint in HF_DIR (config.json, *.safetensors, tokenizer.json): the "
                    "same keys, tensors, types and bytes. Architectures: BertModel "
                    "(sentence-transformers too), NomicBertModel, LlamaForCausalLM, "
                    "Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM.")
    p.add_argument("model", metavar="HF_DIR", help="the checkpoint folder")
    p.add_argument("--outfile", metavar="OUT",
                   help="the GGUF file to write ({ftype} is replaced by the type); default: "
                        "llama.cpp's name for it, inside HF_DIR")
    p.add_argument("--outtype", choices=OUTTYPES, default="auto",
                   help="f32, f16, bf16, q8_0, or auto: the checkpoint's 16-bit type (f16 "
                        "when it is float32); 1-D tensors, norms and biases stay f32")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..convert import convert

    start = time.perf_counter()
    try:
        path = convert(args.model, args.outfile, args.outtype)
    except OSError as e:
        from . import CLIError

        raise CLIError(f"cannot write {args.outfile or args.model}: {e.strerror or e}") \
            from None
    print(f"wrote {path} ({path.stat().st_size / (1 << 20):.1f} MB) in "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0
