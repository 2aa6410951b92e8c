"""Compare gguflm's table of llama.cpp options (gguflm/cli/llama_options.py: ARG_CPP) with
the options a llama.cpp source tree's common/arg.cpp declares, per tool.

    python benchmarks/check_llama_flags.py path/to/llama.cpp

(llama.cpp's source: ``pip download --no-deps --no-binary :all: llama-cpp-python`` and
unpack; it is in vendor/llama.cpp.) Prints the options one side has and the other lacks;
exit status 1 when they differ.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gguflm.cli.llama_options import ARG_CPP, ARG_CPP_TOOLS

STR = r'"(?:[^"\\]|\\.)*"'
EXAMPLES = {"CLI": "cli", "COMPLETION": "completion", "SERVER": "server",
            "PERPLEXITY": "perplexity", "EMBEDDING": "embedding", "TOKENIZE": "tokenize"}


def _arguments(text: str) -> tuple[list[str], int]:
    """The top-level comma-separated arguments of a call whose '(' is just before text,
    and where the call ends (strings and // comments skipped)."""
    parts, depth, cur, i = [], 0, "", 0
    while True:
        c = text[i]
        if c == '"':
            m = re.match(STR, text[i:])
            cur += m.group(0)
            i += len(m.group(0))
            continue
        if text.startswith("//", i):
            i = text.index("\n", i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return [*parts, cur], i
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
        i += 1


def llama_cpp_options(arg_cpp: str) -> dict[str, tuple[int, frozenset[str]]]:
    """flags (space-joined) -> (values taken, tools), negations as options of their own."""
    body = arg_cpp[arg_cpp.index("auto add_opt = [&](common_arg arg)"):]
    out: dict[str, tuple[int, frozenset[str]]] = {}
    for m in re.finditer(r"add_opt\(common_arg\(", body):
        parts, end = _arguments(body[m.end():])
        tail = body[m.end() + end:m.end() + end + 600].split("add_opt(")[0]
        flags = [f[1:-1] for f in re.findall(STR, parts[0]) if f[1:2] == "-"]
        negs = []
        if len(parts) == 4 and parts[1].strip().startswith("{"):
            nargs, negs = 0, [f[1:-1] for f in re.findall(STR, parts[1])]
        else:
            nargs = {3: 0, 4: 1, 5: 2}[len(parts)]
        ex = re.search(r"\.set_examples\(\{([^}]*)\}\)", tail)
        exc = re.search(r"\.set_excludes\(\{([^}]*)\}\)", tail)
        names = set(re.findall(r"LLAMA_EXAMPLE_(\w+)", ex.group(1))) if ex else {"COMMON"}
        excluded = set(re.findall(r"LLAMA_EXAMPLE_(\w+)", exc.group(1))) if exc else set()
        tools = set(ARG_CPP_TOOLS) if "COMMON" in names else {EXAMPLES[n] for n in names
                                                             if n in EXAMPLES}
        tools -= {EXAMPLES[n] for n in excluded if n in EXAMPLES}
        for group, n in ((flags, nargs), (negs, 0)):
            if group and tools:
                key = " ".join(group)
                old = out.get(key, (n, frozenset()))[1]
                out[key] = (n, old | tools)
    return out


def main(root: str) -> int:
    theirs = llama_cpp_options((Path(root) / "common" / "arg.cpp").read_text())
    ours = {flags: (n, frozenset(ARG_CPP_TOOLS) if where == "*" else frozenset(where.split()))
            for flags, n, where, _ in ARG_CPP}
    bad = 0
    for flags in sorted(set(theirs) | set(ours)):
        if theirs.get(flags) != ours.get(flags):
            bad += 1
            print(f"{flags}: llama.cpp {theirs.get(flags)}, gguflm {ours.get(flags)}")
    print(f"{len(theirs)} llama.cpp options, {len(ours)} in gguflm's table, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
