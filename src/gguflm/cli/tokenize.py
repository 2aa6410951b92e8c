"""``gguflm tokenize MODEL TEXT`` and ``gguflm detokenize MODEL IDS...``."""

from __future__ import annotations

import argparse
import json
import re
import sys

from . import CLIError, UsageError
from .common import add_model_argument, read_text


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tokenize", help="show the tokens of a text",
        description="Tokenize TEXT with MODEL's tokenizer (a GGUF file, vocabulary-only files "
                    "included, or a known model name), as llama.cpp does: one line per token, "
                    "id -> piece (special tokens shown).")
    add_model_argument(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("text", nargs="?", metavar="TEXT", help="the text to tokenize")
    src.add_argument("-p", "--prompt", metavar="TEXT",
                     help="the same as TEXT (llama-tokenize's spelling)")
    src.add_argument("-f", "--file", metavar="FILE", help="read the text from FILE ('-': stdin)")
    src.add_argument("--stdin", action="store_true", help="read the text from stdin (-f -)")
    special = p.add_mutually_exclusive_group()
    special.add_argument("--special", action="store_true",
                         help="parse special tokens written in the text (e.g. <|im_start|>)")
    special.add_argument("--no-parse-special", dest="special", action="store_false",
                         help="take special tokens' text as plain text (gguflm's default; "
                              "llama-tokenize parses them unless given this)")
    p.add_argument("--show-count", action="store_true",
                   help="print the number of tokens at the end")
    p.add_argument("--log-disable", action="store_true",
                   help="accepted: tokenize prints no status lines")
    p.add_argument("--no-bos", action="store_true",
                   help="do not add the BOS/EOS tokens the model asks for")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--ids", action="store_true", help="print only the ids, as a list")
    out.add_argument("--json", action="store_true",
                     help="print one JSON object: ids, pieces, n_tokens")
    p.set_defaults(func=run_tokenize)

    d = subparsers.add_parser(
        "detokenize", help="turn token ids back into text",
        description="Print the text of token IDS (separated by spaces or commas; a pasted "
                    "[1, 2, 3] list works too). Control tokens render as nothing unless "
                    "--special.")
    add_model_argument(d)
    d.add_argument("ids", nargs="+", metavar="IDS", help="token ids")
    d.add_argument("--special", action="store_true", help="render control tokens as their text")
    d.add_argument("--json", action="store_true", help="print one JSON object: ids, text")
    d.set_defaults(func=run_detokenize)


def _tokenizer(model: str):
    from ..tokenizer import Tokenizer
    from .pull import resolve

    return Tokenizer.from_file(resolve(model))


def _read_text(args: argparse.Namespace) -> str:
    if args.stdin:
        args.file = "-"
    if args.file is not None:
        return read_text(args.file, errors="surrogateescape")
    text = args.text if args.text is not None else args.prompt
    if text is None:
        raise UsageError("give the text to tokenize: TEXT, -p TEXT, -f FILE or --stdin")
    return text


def _show(piece: bytes) -> str:
    """A piece for JSON: invalid UTF-8 (part of a character) as \\xNN text."""
    return piece.decode("utf-8", "backslashreplace")


def _quoted(piece: bytes) -> str:
    """A piece for a terminal: JSON-quoted, invalid UTF-8 bytes shown as \\xNN."""
    parts = []
    for run in _LONE_BYTE.split(piece.decode("utf-8", "surrogateescape")):
        if len(run) == 1 and _LONE_BYTE.match(run):
            parts.append(f"\\x{ord(run) - 0xDC00:02x}")
        elif run:
            parts.append(json.dumps(run, ensure_ascii=False)[1:-1])
    return '"' + "".join(parts) + '"'


_LONE_BYTE = re.compile("([\udc80-\udcff])")


def run_tokenize(args: argparse.Namespace) -> int:
    text = _read_text(args)
    tok = _tokenizer(args.model)
    ids = tok.encode(text, add_special=not args.no_bos, parse_special=args.special)
    if args.ids:
        print(json.dumps(ids))
    elif args.json:
        pieces = [_show(tok.token_to_piece(t, special=True)) for t in ids]
        print(json.dumps({"ids": ids, "pieces": pieces, "n_tokens": len(ids)},
                         ensure_ascii=False))
    else:
        for t in ids:
            print(f"{t:>7} -> {_quoted(tok.token_to_piece(t, special=True))}")
    if args.show_count and not args.json:
        print(f"Total number of tokens: {len(ids)}")  # llama-tokenize's words
    return 0


_SEPARATORS = re.compile(r"[\s,\[\]]+")


def parse_ids(words: list[str]) -> list[int]:
    """Token ids from command-line words: ``1 2 3``, ``1,2,3`` or ``[1, 2, 3]``."""
    ids = []
    for word in _SEPARATORS.split(" ".join(words)):
        if not word:
            continue
        try:
            ids.append(int(word))
        except ValueError:
            raise CLIError(f"invalid token id {word!r}: not an integer") from None
    return ids


def run_detokenize(args: argparse.Namespace) -> int:
    ids = parse_ids(args.ids)
    tok = _tokenizer(args.model)
    bad = [t for t in ids if not 0 <= t < tok.n_vocab]
    if bad:
        raise CLIError(f"token id {bad[0]} is out of range: {args.model} has {tok.n_vocab} "
                       f"tokens (0..{tok.n_vocab - 1})")
    text = tok.decode(ids, special=args.special)
    if args.json:
        print(json.dumps({"ids": ids, "text": text}, ensure_ascii=False))
    else:
        sys.stdout.write(text + "\n")
    return 0
