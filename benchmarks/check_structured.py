"""The bars of the structured-output issue that need many generations, on both real models:

    .venv/bin/python benchmarks/check_structured.py [--only schemas|grammars|tools]

* schemas: every schema of tests/constrained.py's matrix (32, covering each supported
  feature) on SmolLM2 and Gemma 3 at temperature 0 and 0.8: the answer must end with EOS,
  parse, and validate (jsonschema with format checks); a recursive schema is run too and
  reported apart (small models may nest until max_tokens);
* grammars: every GBNF grammar of llama.cpp's grammars/ directory on both models at both
  temperatures: the output is in the grammar's language (parsers of our own for json,
  json_arr, arithmetic, list, chess, english, japanese; c only compiles and generates);
* tools: tool_choice required and each named function, in the three formats (the models'
  own templates fall back to JSON; Qwen 2.5's template gives hermes, Llama 3.1's llama3), on
  both models at both temperatures, for three questions: every reply must parse into tool
  calls whose arguments validate against the function's parameters, finish_reason
  tool_calls.

Prints one line per failure and a summary per part; exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import jsonschema  # noqa: E402

from constrained import (  # noqa: E402
    GRAMMAR_PROMPTS,
    GRAMMARS,
    LLAMA31,
    LLAMA_CPP_GRAMMARS,
    QWEN,
    RECURSIVE,
    SCHEMAS,
    TOOL_QUESTIONS,
    TOOLS,
    Chat,
    check_grammar_output,
    check_json,
    tool_parameters,
)
from gguflm.engine.grammar import gbnf_grammar, json_schema_grammar  # noqa: E402
from gguflm.engine.tools import plan_tools  # noqa: E402
from gguflm.tokenizer.chat import ChatTemplate  # noqa: E402

CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))
MODELS = {"smollm2": CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3": CACHE / "gemma-3-270m-q4_k_m.gguf"}
TEMPS = (0.0, 0.8)


def schemas(chats: dict[str, Chat]) -> int:
    bad = 0
    for model, chat in chats.items():
        for temp in TEMPS:
            for sid, _, question, schema in [*SCHEMAS, RECURSIVE]:
                run = chat.run(chat.ask(f"{question} Answer in JSON."),
                               json_schema_grammar(schema), temp=temp, max_tokens=160)
                why = None
                if run.stop != "eos":
                    why = f"ended by {run.stop}"
                else:
                    try:
                        check_json(schema, run.text)
                    except (ValueError, jsonschema.ValidationError) as e:
                        why = f"invalid: {str(e).splitlines()[0]}"
                if why:
                    recursive = sid == RECURSIVE[0]
                    bad += not recursive
                    print(f"{'note' if recursive else 'FAIL'} schema {sid} {model} t={temp}: "
                          f"{why}: {run.text[:120]!r}")
    total = len(chats) * len(TEMPS) * len(SCHEMAS)
    print(f"schemas: {total - bad}/{total} ended with EOS, parsed and validated "
          f"(the recursive schema is reported apart: notes above)")
    return bad


def grammars(chats: dict[str, Chat]) -> int:
    bad = total = 0
    for model, chat in chats.items():
        for temp in TEMPS:
            for name in LLAMA_CPP_GRAMMARS:
                g = gbnf_grammar((GRAMMARS / f"{name}.gbnf").read_text(encoding="utf-8"))
                run = chat.run(chat.ask(GRAMMAR_PROMPTS[name]), g, temp=temp, max_tokens=48)
                total += 1
                try:
                    check_grammar_output(name, run.text, run.stop == "eos")
                except Exception as e:  # noqa: BLE001 - any checker failure is a miss
                    bad += 1
                    print(f"FAIL grammar {name} {model} t={temp} ({run.stop}): "
                          f"{type(e).__name__}: {run.text[:120]!r}")
    print(f"grammars: {total - bad}/{total} outputs in their grammar's language "
          f"({len(LLAMA_CPP_GRAMMARS)} of {len(LLAMA_CPP_GRAMMARS)} grammars accepted)")
    return bad


def tools(chats: dict[str, Chat]) -> int:
    bad = total = 0
    choices = ["required"] + [{"type": "function", "function": {"name": t["function"]["name"]}}
                              for t in TOOLS]
    for model, chat in chats.items():
        templates = {"json": chat.template,
                     "hermes": ChatTemplate.for_tokenizer(chat.tokenizer, override=QWEN),
                     "llama3": ChatTemplate.for_tokenizer(chat.tokenizer, override=LLAMA31)}
        for fmt, template in templates.items():
            for choice in choices:
                for question in TOOL_QUESTIONS:
                    msgs = [{"role": "user", "content": question}]
                    plan = plan_tools(msgs, TOOLS, choice, template.source,
                                      parallel_tool_calls=False)
                    assert plan.format == fmt
                    prompt = chat.prompt(plan.messages, template, plan.template_tools)
                    for temp in TEMPS:
                        run = chat.run(prompt, plan.grammar, temp=temp, max_tokens=160)
                        total += 1
                        reply = plan.parse(run.text)
                        finish = reply.finish_reason("stop" if run.stop == "eos" else "length")
                        why = None
                        if finish != "tool_calls" or len(reply.tool_calls) != 1:
                            why = f"finish {finish}, {len(reply.tool_calls)} calls"
                        else:
                            call = reply.tool_calls[0]
                            want = choice["function"]["name"] if isinstance(choice, dict) \
                                else None
                            try:
                                args = json.loads(call.arguments)
                                jsonschema.validate(args, tool_parameters(call.name))
                                if want and call.name != want:
                                    why = f"called {call.name}, not {want}"
                            except (ValueError, jsonschema.ValidationError) as e:
                                why = f"arguments: {str(e).splitlines()[0]}"
                        if why:
                            bad += 1
                            print(f"FAIL tools {model} {fmt} {json.dumps(choice)} t={temp}: "
                                  f"{why}: {run.text[:120]!r}")
    print(f"tools: {total - bad}/{total} replies were valid calls (finish_reason tool_calls)")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["schemas", "grammars", "tools"])
    args = ap.parse_args()
    missing = [str(p) for p in MODELS.values() if not p.is_file()]
    if missing:
        sys.exit(f"error: models missing: {', '.join(missing)} (run `gguflm pull`)")
    chats = {name: Chat(path) for name, path in MODELS.items()}
    bad = 0
    for part in (schemas, grammars, tools):
        if args.only in (None, part.__name__):
            t0 = time.perf_counter()
            bad += part(chats)
            print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
