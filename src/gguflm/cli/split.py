"""``gguflm split IN OUT`` and ``gguflm merge IN OUT``: llama.cpp's ``llama-gguf-split
--split``/``--merge``, writing the same files byte for byte (gguf/split.py)."""

from __future__ import annotations

import argparse
import os
import re
import sys

from . import CLIError, UsageError
from .common import positive_int


def _size(text: str) -> int:
    """gguf-split's ``N(M|G)``: megabytes or gigabytes of 10^6 / 10^9 bytes."""
    m = re.fullmatch(r"(\d+)([MG])", text)
    if not m or int(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive N followed by M or G "
                                         f"(10^6 or 10^9 bytes), e.g. 500M or 4G; got {text!r}")
    return int(m.group(1)) * (10**6 if m.group(2) == "M" else 10**9)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "split", help="split a GGUF model into shards (llama-gguf-split --split)",
        description="Write IN as shards OUT-00001-of-0000N.gguf, ... exactly as "
                    "llama-gguf-split --split does: the first holds all the metadata; each "
                    "holds split.no, split.count and split.tensors.count. gguflm loads a split "
                    "model from its first shard.")
    p.add_argument("input", metavar="IN", help="the GGUF model to split")
    p.add_argument("output", metavar="OUT", help="the shards' name before -0000i-of-0000n.gguf")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--split-max-tensors", type=positive_int, default=None, metavar="N",
                     help="at most N tensors per shard (default: 128)")
    how.add_argument("--split-max-size", type=_size, default=None, metavar="N(M|G)",
                     help="at most this many bytes of tensors per shard")
    p.add_argument("--no-tensor-first-split", action="store_true",
                   help="the first shard holds only the metadata")
    p.add_argument("--dry-run", action="store_true",
                   help="print the shards that would be written, write nothing")
    p.set_defaults(func=run_split)

    m = subparsers.add_parser(
        "merge", help="merge a split GGUF model into one file (llama-gguf-split --merge)",
        description="Write the split model whose first shard is IN as the one file OUT, "
                    "exactly as llama-gguf-split --merge does.")
    m.add_argument("input", metavar="IN", help="the first shard (NAME-00001-of-0000N.gguf)")
    m.add_argument("output", metavar="OUT", help="the merged GGUF file (must not exist)")
    m.set_defaults(func=run_merge)


def run_split(args: argparse.Namespace) -> int:
    from .. import gguf
    from ..gguf.split import plan_split, shard_path, split_file, split_info

    with gguf.open(args.input) as src:
        if split_info(src) is not None and split_info(src)[1] > 1:
            raise CLIError(f"{args.input} is already a shard of a split model; merge it first")
        plan = plan_split(src, max_tensors=args.split_max_tensors or 128,
                          max_size=args.split_max_size,
                          no_tensor_first_split=args.no_tensor_first_split)
        count = len(plan.shards)
        for i, names in enumerate(plan.shards):
            size = sum(src.tensors[n].nbytes for n in names)
            print(f"{shard_path(args.output, i, count)}: {len(names)} tensors, "
                  f"{size / 1e6:.0f} MB", file=sys.stderr)
        if args.dry_run:
            return 0
        for i in range(count):
            path = shard_path(args.output, i, count)
            if os.path.lexists(path):
                raise CLIError(f"{path} already exists; remove it or choose another OUT")
        split_file(src, args.output, plan)
    print(f"{count} shards written, {len(src.tensors)} tensors in all", file=sys.stderr)
    return 0


def run_merge(args: argparse.Namespace) -> int:
    from .. import gguf
    from ..gguf.split import merge_files, split_info

    if os.path.lexists(args.output):
        raise UsageError(f"{args.output} already exists; merge writes a new file")
    with gguf.open(args.input) as first:
        info = split_info(first)
        if info is None:
            raise CLIError(f"{args.input} is not a shard of a split model (no split.count)")
        merge_files(first, args.output)
        n = len(first.tensors)
    print(f"{args.output}: merged from {info[1]} shards, {n} tensors", file=sys.stderr)
    return 0
