"""``gguflm rerank MODEL QUERY DOC...``: rank documents by relevance to a query with a
reranker (a cross-encoder or a Qwen3-Reranker-style model), as llama-server's
``/v1/rerank`` scores them."""

from __future__ import annotations

import argparse
import json
import sys

from . import CLIError, UsageError
from .common import add_load_options, add_status_options
from .serve import add_model_options, load_llm


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rerank", help="rank documents by relevance to a query (llama-server's /v1/rerank)",
        description="Score each DOC's relevance to QUERY with MODEL, a reranker (a GGUF "
                    "file with a classifier head: a BERT cross-encoder or a "
                    "Qwen3-Reranker-style model), and print them best first: rank, score, "
                    "the document's position among the DOCs, its text. --json prints "
                    "llama-server's rerank object.")
    p.add_argument("model", metavar="MODEL", help="GGUF file or known model name")
    p.add_argument("query", metavar="QUERY", help="the query")
    p.add_argument("documents", nargs="+", metavar="DOC", help="a document (one or more)")
    p.add_argument("--top-n", type=int, metavar="N", help="print only the N best")
    p.add_argument("--json", action="store_true",
                   help="print llama-server's rerank object (results, usage)")
    add_model_options(p)
    add_status_options(p, perf=False)
    add_load_options(p)
    p.set_defaults(func=run, chat_template=None, owns_cores=True)


def run(args: argparse.Namespace) -> int:
    from ..api import InvalidRequestError

    if args.top_n is not None and args.top_n < 0:
        raise UsageError(f"--top-n must be 0 or more, got {args.top_n}")
    llm = load_llm(args, parallel=min(len(args.documents), 8))
    try:
        result = llm.rerank(args.query, args.documents, args.top_n)
    except InvalidRequestError as e:
        raise CLIError(str(e)) from None
    finally:
        llm.close()
    if args.json:
        print(json.dumps(result))
        return 0
    for rank, r in enumerate(result["results"], 1):
        text = args.documents[r["index"]].replace("\n", " ")
        text = text if len(text) <= 60 else text[:57] + "..."
        print(f"{rank:3d}  {r['relevance_score']:10.6f}  [{r['index']}] {text}")
    print(f"[{len(args.documents)} documents, {result['usage']['prompt_tokens']} tokens]",
          file=sys.stderr)
    return 0
