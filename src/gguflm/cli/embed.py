"""``gguflm embed [MODEL] -p TEXT ...``: embeddings of texts, as llama.cpp's
``llama-embedding`` computes them (the final hidden states, pooled and normalized)."""

from __future__ import annotations

import argparse
import json
import sys

from . import CLIError, UsageError
from .common import add_load_options, add_model_argument, add_status_options, read_text
from .serve import add_model_options, load_llm


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..hub import DEFAULT_MODEL

    p = subparsers.add_parser(
        "embed", help="embeddings of texts (llama.cpp's llama-embedding)",
        description=f"Embed each TEXT with MODEL (a GGUF file or a known model name, default "
                    f"{DEFAULT_MODEL}): the final hidden states of its tokens, pooled "
                    "(--pooling) and normalized (--embd-normalize), as llama.cpp computes "
                    "them. Prints each vector (its first and last values) and, for several "
                    "texts, their cosine similarities; --json prints OpenAI's embeddings "
                    "object with the whole vectors.")
    add_model_argument(p, optional=True)
    p.add_argument("-p", "--prompt", action="append", default=[], metavar="TEXT",
                   help="a text to embed (repeat for more)")
    p.add_argument("-f", "--file", metavar="FILE",
                   help="texts to embed, one per line ('-': stdin; see --embd-separator)")
    p.add_argument("--embd-separator", default="\n", metavar="SEP",
                   help="what separates the texts of -f FILE (default: a newline)")
    p.add_argument("--pooling", choices=("mean", "cls", "last", "none"),
                   help="how token vectors become one (default: the model's pooling_type, "
                        "else mean); none: one vector per token")
    p.add_argument("--embd-normalize", type=int, default=2, metavar="N",
                   help="normalization: -1 none, 0 max-abs to int16, 1 taxicab, 2 Euclidean "
                        "(default), p > 2 p-norm")
    p.add_argument("--json", action="store_true",
                   help="print OpenAI's embeddings object (data[i].embedding, usage)")
    add_model_options(p)
    add_status_options(p, perf=False)
    add_load_options(p)
    p.set_defaults(func=run, chat_template=None, owns_cores=True)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..api import InvalidRequestError

    texts = list(args.prompt)
    if args.file is not None:
        sep = args.embd_separator.replace("\\n", "\n")
        texts += [t for t in read_text(args.file).split(sep) if t.strip()]
    if not texts:
        raise UsageError("nothing to embed: give -p TEXT (repeatable) or -f FILE")
    if args.embd_normalize < -1:
        raise UsageError(f"--embd-normalize must be -1 or more, got {args.embd_normalize}")
    llm = load_llm(args, parallel=min(len(texts), 8))
    try:
        vectors = llm.embed(texts, pooling=args.pooling, normalize=args.embd_normalize) \
            if len(texts) > 1 else [llm.embed(texts[0], pooling=args.pooling,
                                              normalize=args.embd_normalize)]
    except InvalidRequestError as e:
        raise CLIError(str(e)) from None
    finally:
        llm.close()
    pooling = args.pooling or llm.pooling
    if args.json:
        n_tokens = sum(len(llm.tokenizer.encode(t, parse_special=True)) for t in texts)
        print(json.dumps({"object": "list", "model": llm.model_id, "pooling": pooling,
                          "data": [{"object": "embedding", "index": i, "embedding": v}
                                   for i, v in enumerate(vectors)],
                          "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}))
        return 0
    for i, v in enumerate(vectors):
        arr = np.asarray(v, np.float32)
        rows = arr if pooling == "none" else arr[None]
        for j, row in enumerate(rows):
            label = f"embedding {i}" + (f" token {j}" if pooling == "none" else "")
            head = " ".join(f"{x:9.6f}" for x in row[:3])
            tail = " ".join(f"{x:9.6f}" for x in row[-3:])
            print(f"{label}: {head} ... {tail} ({len(row)} values)")
    if len(vectors) > 1 and pooling != "none":
        m = np.asarray(vectors, np.float64)
        m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-30)
        sim = m @ m.T
        print("\ncosine similarity matrix:")
        for i, row in enumerate(sim):
            print(" ".join(f"{x:6.3f}" for x in row) + f"  {texts[i][:40]!r}")
    path = getattr(llm.model, "forward_path", None)  # an encoder says which code it ran
    print(f"[{len(texts)} texts, pooling {pooling}, normalize {args.embd_normalize}"
          f"{'; ' + path if path else ''}]", file=sys.stderr)
    return 0
