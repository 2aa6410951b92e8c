"""What several commands share: the MODEL argument (positional or ``-m``), integer option
types, llama.cpp's the optional values of some llama.cpp options, the model-loading
options (``--override-kv``, ``--no-bos``, ``--rope-style``), reading a text file, loading a
model with its tokenizer and warming it up, and a progress line for long work.

Heavy modules (numpy, the model) are imported inside the functions, so that importing this
module keeps ``gguflm --help`` fast.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from . import CLIError


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer of at least 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def add_model_argument(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """The MODEL positional: a GGUF file or a known model name (pulled on first use), also
    as ``-m/--model MODEL`` (llama.cpp's spelling); ``optional``: it may be left out for
    the default model. ``finish_model_argument`` reconciles the two after parsing.
    llama.cpp's ``-hf ORG/REPO[:QUANT]`` options name it too (``pull.add_hf_options``)."""
    from .pull import add_hf_options

    add_hf_options(p)
    if not optional:
        p.add_argument("model", nargs="?", metavar="MODEL",
                       help="GGUF file or known model name (or -m MODEL)")
        p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL",
                       help="the same as the positional MODEL")
        p.set_defaults(model_required=True)
        return
    from ..hub import DEFAULT_MODEL

    p.add_argument("model", nargs="?", metavar="MODEL",
                   help=f"GGUF file or known model name (default: {DEFAULT_MODEL})")
    p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL",
                   help="the same as the positional MODEL")
    p.set_defaults(model_default=DEFAULT_MODEL)


def finish_model_argument(args: argparse.Namespace) -> None:
    """After parsing: MODEL from the positional or ``-m`` (not two different ones), else
    the default; a UsageError when a required MODEL is missing."""
    from . import UsageError

    if not hasattr(args, "model_flag"):
        return
    flag, pos = args.model_flag, args.model
    if flag is not None and pos is not None and flag != pos:
        raise UsageError(f"two models given: {pos} and -m {flag}")
    args.model = flag if flag is not None else pos
    from .pull import finish_hf_options

    finish_hf_options(args)
    if args.model is None:
        if getattr(args, "model_required", False):
            raise UsageError("MODEL is required (a GGUF file or a known model name)")
        args.model = args.model_default


# llama.cpp options whose value may be left out: without one of these after it, the
# option is the plain switch (so that it never swallows the next argument, e.g. a MODEL)
# (llama.cpp reads on/enabled/true/1, off/disabled/false/0 and auto/-1 for these)
_SWITCH_WORDS = ("on", "off", "auto", "enabled", "disabled", "true", "false", "1", "0", "-1")
OPTIONAL_VALUES = {"-fa": _SWITCH_WORDS, "--flash-attn": _SWITCH_WORDS,
                   "-co": _SWITCH_WORDS, "--color": _SWITCH_WORDS}
SWITCH_VALUES = {"enabled": "on", "true": "on", "1": "on", "disabled": "off", "false": "off",
                 "0": "off", "-1": "auto"}


def normalize_argv(argv: list[str], known: frozenset[str] = frozenset()) -> list[str]:
    """``-fa`` and ``-co``/``--color`` without one of on/off/auto after them mean on; a
    ``--long_name`` that is one of the ``known`` options with dashes is that option
    (llama.cpp reads ``_`` in long options as ``-``: ``--repeat_penalty``)."""
    argv = [a.replace("_", "-") if a.startswith("--") and "=" not in a and "_" in a
            and a.replace("_", "-") in known else a for a in argv]
    out = []
    for i, a in enumerate(argv):
        values = OPTIONAL_VALUES.get(a)
        if values and (i + 1 >= len(argv) or argv[i + 1] not in values):
            out += [a, "on"]
            continue
        out.append(a)
    return out


# the caches gguflm has: gguflm.model.kv_cache.KV_TYPES (not imported here: heavy; a test
# checks that the two agree)
KV_CACHE_TYPES = ("f16", "f32", "q8_0")
# llama.cpp's other cache types: accepted, and the cache is f16 (said in a note)
LLAMA_KV_CACHE_TYPES = ("bf16", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def add_kv_cache_options(p: argparse.ArgumentParser) -> None:
    """llama.cpp's ``-ctk``/``-ctv``: the KV cache's number type (keys and values share
    one in gguflm)."""
    for short, long, what in (("-ctk", "--cache-type-k", "keys"),
                              ("-ctv", "--cache-type-v", "values")):
        p.add_argument(short, long, choices=KV_CACHE_TYPES + LLAMA_KV_CACHE_TYPES,
                       type=str.lower, default=None, metavar="TYPE",
                       help=f"number type of the KV cache's {what}: f16 (default, as llama.cpp), "
                            "f32 (exact attention, twice the memory) or q8_0 (ggml Q8_0 "
                            "blocks, about half the memory); keys and values share one type "
                            "(llama.cpp's other quantized types are taken as f16, with a note)")


def kv_cache_type(args: argparse.Namespace) -> str:
    """The cache type ``-ctk``/``-ctv`` ask for (default f16); a UsageError for two."""
    from . import UsageError

    k, v = getattr(args, "cache_type_k", None), getattr(args, "cache_type_v", None)
    other = [t for t in (k, v) if t in LLAMA_KV_CACHE_TYPES]
    if other and not getattr(args, "kv_noted", False):
        args.kv_noted = True
        if not getattr(args, "log_disable", False):
            print(f"note: -ctk/-ctv {other[0]}: gguflm's KV cache holds f16, f32 or q8_0 "
                  "numbers; using f16 (more memory than a quantized cache, more exact)",
                  file=sys.stderr, flush=True)
    k = "f16" if k in LLAMA_KV_CACHE_TYPES else k
    v = "f16" if v in LLAMA_KV_CACHE_TYPES else v
    if k and v and k != v:
        raise UsageError(f"-ctk {k} and -ctv {v}: gguflm's cache holds keys and values in "
                         "one type; give both the same")
    return k or v or "f16"


def use_kv_cache_type(model: Any, kv: str) -> None:
    """Make ``model``'s caches of type ``kv``; a UsageError when its heads cannot be."""
    from . import UsageError

    try:
        model.use_kv_type(kv)
    except ValueError as e:
        raise UsageError(f"-ctk/-ctv {kv}: {e}") from None


def add_batch_options(p: argparse.ArgumentParser) -> None:
    """llama.cpp's ``-b``/``-ub``: prompt tokens evaluated per step (see ``batch_size``)."""
    from ..engine.scheduler import N_BATCH

    p.add_argument("-b", "--batch-size", type=positive_int, default=None, metavar="N",
                   help=f"logical batch: prompt tokens per step at most (default: {N_BATCH}, "
                        f"also the most gguflm takes)")
    p.add_argument("-ub", "--ubatch-size", type=positive_int, default=None, metavar="N",
                   help=f"physical batch: the rows one product computes at most; gguflm's "
                        f"steps are single products, so a step holds min(-b, -ub) rows "
                        f"(default: {N_BATCH}); the logits do not depend on it")


def batch_size(args: argparse.Namespace) -> int:
    """Rows per step from ``-b``/``-ub`` (the smaller; at most the engine's N_BATCH)."""
    from ..engine.scheduler import N_BATCH

    sizes = [n for n in (getattr(args, "batch_size", None), getattr(args, "ubatch_size", None))
             if n is not None]
    return min([N_BATCH, *sizes])


COLOR_CHOICES = ("on", "off", "auto")


def _switch(text: str) -> str:
    return SWITCH_VALUES.get(text.lower(), text.lower())


def add_color_option(p: argparse.ArgumentParser, what: str) -> None:
    """llama.cpp's ``-co``/``--color [on|off|auto]`` (alone: on; see normalize_argv)."""
    p.add_argument("-co", "--color", choices=COLOR_CHOICES, type=_switch, default="off",
                   metavar="WHEN",
                   help=f"{what}: on (also -co alone), off (default), auto (on a terminal)")


def color_on(args: argparse.Namespace, stream: Any) -> bool:
    """Whether ``--color`` asks for colour on ``stream``."""
    return args.color == "on" or (args.color == "auto" and stream.isatty())


def add_status_options(p: argparse.ArgumentParser, perf: bool = True) -> None:
    """What a command prints besides its output: --no-warmup, --log-disable and (``perf``)
    --no-perf."""
    warm = p.add_mutually_exclusive_group()
    warm.add_argument("--no-warmup", dest="warmup", action="store_false", default=True,
                      help="skip the warm-up run (the first step then pays for loading, or "
                           "compiling, the kernels)")
    warm.add_argument("--warmup", dest="warmup", action="store_true",
                      help="warm the kernels up before the timed work (the default)")
    p.add_argument("--log-disable", action="store_true",
                   help="print nothing on stderr but errors (no notes, no timings)")
    if not perf:
        return
    timings = p.add_mutually_exclusive_group()
    timings.add_argument("--no-perf", "--no-show-timings", dest="perf", action="store_false",
                      default=True, help="do not print the timings line at the end")
    timings.add_argument("--perf", "--show-timings", dest="perf", action="store_true",
                      help="print the timings line at the end (the default)")


def add_load_options(p: argparse.ArgumentParser) -> None:
    """How the model is loaded: ``--override-kv``, ``--no-bos``, ``--rope-style``."""
    g = p.add_argument_group("loading the model")
    g.add_argument("--override-kv", metavar="KEY=TYPE:VALUE", action="append", default=[],
                   type=_kv_overrides,
                   help="replace a metadata value at load, as llama.cpp does (TYPE: int, "
                        "float, bool, str; several: repeat, or separate with commas), e.g. "
                        "llama.rope.freq_base=float:100000")
    g.add_argument("--no-bos", action="store_true",
                   help="never add the BOS token, whatever the file's metadata says")
    g.add_argument("--rope-style", choices=("norm", "neox"),
                   help="RoPE pairing to use instead of the architecture's (for a file whose "
                        "Q/K rows were converted for the other one)")


def _kv_overrides(text: str) -> list[tuple[str, Any]]:
    from ..model.overrides import KVOverrideError, parse_kv_override

    try:
        return [parse_kv_override(item) for item in text.split(",") if item]
    except KVOverrideError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """``load_model``/``LLM`` keywords from ``add_load_options``: kv_overrides, rope_style."""
    overrides: dict[str, Any] = {}
    for group in getattr(args, "override_kv", None) or []:
        overrides.update(group)
    if getattr(args, "no_bos", False):
        overrides["tokenizer.ggml.add_bos_token"] = False
    return {"kv_overrides": overrides or None, "rope_style": getattr(args, "rope_style", None)}


def add_threads_argument(p: argparse.ArgumentParser) -> None:
    """``-t N``: threads for the matrix kernels (default: the cores available)."""
    p.add_argument("-t", "--threads", type=positive_int, default=None, metavar="N",
                   help="threads (default: the cores available)")


def read_text(path: str | Path, errors: str = "strict", option: str = "-f") -> str:
    """A UTF-8 text file ('-': standard input) named by ``option`` (a key of
    ``textfiles.TEXT_FILE_OPTIONS``), or a CLIError that says why not (textfiles.py: not a
    regular file, over the option's cap, not UTF-8). ``errors="surrogateescape"`` keeps
    invalid bytes instead of refusing the file."""
    from .textfiles import read_text_file

    return read_text_file(path, option, errors)


class Loaded(NamedTuple):
    """A model file loaded for a command."""

    path: Path
    model: Any       # gguflm.model.Model
    tokenizer: Any   # gguflm.tokenizer.Tokenizer
    seconds: float   # loading the model and its tokenizer (not pulling it)


def load_model(name: str, threads: int | None = None,
               options: dict[str, Any] | None = None) -> Loaded:
    """MODEL (a path or a known name, pulled with progress on stderr), loaded with its
    tokenizer (``options``: from ``load_options``); says so first when the kernels still
    have to be compiled."""
    from .. import load_model as load
    from ..quant.matrix import set_threads
    from ..tokenizer import Tokenizer
    from .pull import resolve

    path = resolve(name)
    set_threads(threads)
    t0 = time.perf_counter()
    model = load(path, **(options or {}))
    refuse_encoder(model, path)
    say_if_compiling()  # (the kernels compile at the warm-up, after this)
    tokenizer = Tokenizer.from_gguf(model.gguf)
    say_if_not_compiled(model)
    say_if_larger_than_memory(path)
    return Loaded(path, model, tokenizer, time.perf_counter() - t0)


def memory_available() -> int | None:
    """Bytes of memory the system can give without swapping (``MemAvailable``), or None
    where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def say_if_larger_than_memory(path: Any, available: int | None = None) -> None:
    """A ``note:`` when the model file is larger than the memory available: it still runs
    (its weights stay memory-mapped, and the pages a token needs, such as the experts it
    is routed to, are read from the file on demand), but slower."""
    available = memory_available() if available is None else available
    size = os.path.getsize(path)
    if available is not None and size > available:
        print(f"note: the model ({size / 1e9:.1f} GB) is larger than the memory available "
              f"({available / 1e9:.1f} GB): it runs from the memory-mapped file, reading "
              f"the weights each token needs from disk as it goes (slower)", file=sys.stderr)


def say_if_not_compiled(model: Any) -> None:
    """A ``note:`` on stderr when the model's layers, or some of their parts, cannot run
    compiled, with the reason (``executor.Plan``): a slower path is never taken silently."""
    plan = model.plan
    if (not plan.compiled or plan.mixed) and not model.is_encoder:  # encoders say theirs
        print(f"note: the layers run {'' if plan.compiled else 'on the '}{plan.describe()}",
              file=sys.stderr)


def refuse_encoder(model: Any, path: Any) -> None:
    """A CLIError for an embedding model given to a command that needs logits."""
    if model.is_encoder:
        raise CLIError(f"{path} is an embedding model ({model.config.arch} encoder): it cannot "
                       "generate text or score tokens; use `gguflm embed` or /v1/embeddings")


def warm_up(model: Any, background: bool = False, join: bool = True) -> float:
    """Run the compiled paths once (``Model.warm_up``) so that the timed work that follows
    pays neither their compilation (first run: its steps shown on stderr) nor their
    loading; the seconds. ``background``: on a first run the compiled layers compile in a
    background process and this command runs on the reference path meanwhile (said);
    ``join``: so it does when such a compilation is found in progress."""
    t0 = time.perf_counter()
    progress = _CompileProgress()
    model.warm_up(report=progress, background=background, join=join)
    progress.finish(model.plan)
    return time.perf_counter() - t0


class _CompileProgress:
    """``Model.warm_up``'s report: one stderr line per compilation step, with the time it
    is expected to take (the model's estimate, scaled by how the steps before went: a busy
    machine takes longer) and, when done, the time it took."""

    def __init__(self) -> None:
        self.t0 = self.started = 0.0
        self.expected = self.taken = 0.0  # of the steps so far

    def _close(self) -> None:
        if self.started:
            took = time.perf_counter() - self.started
            self.taken += took
            print(f" {took:.0f} s", file=sys.stderr, flush=True)

    def __call__(self, step: int, steps: int, what: str, seconds: float) -> None:
        self._close()
        pace = min(6.0, max(0.5, self.taken / self.expected)) if self.expected else 1.0
        self.expected += seconds
        self.started = time.perf_counter()
        self.t0 = self.t0 or self.started
        print(f"gguflm: [{step}/{steps}] compiling {what} (about {seconds * pace:.0f} s) ...",
              end="", file=sys.stderr, flush=True)

    def finish(self, plan: Any) -> None:
        if not self.started:
            return
        self._close()
        took = time.perf_counter() - self.t0
        if plan.waiting():
            print(f"gguflm: ready in {took:.0f} s; this run takes the slower reference "
                  f"path while the compiled layers compile in the background (about "
                  f"{90 * max(1.0, self.taken / self.expected):.0f} s more), then switches; "
                  "later runs load them in about a second", file=sys.stderr, flush=True)
        else:
            print(f"gguflm: kernels ready in {took:.0f} s (later runs load them in about a "
                  "second)", file=sys.stderr, flush=True)


class Progress:
    """One updating line on stderr for long work (``done/total unit pct ETA``), only when
    stderr is a terminal and ``enabled``; otherwise silent."""

    def __init__(self, label: str, total: int, unit: str = "", enabled: bool = True,
                 stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0 and self.stream.isatty()
        self.label, self.total, self.unit = label, total, unit
        self.t0 = time.perf_counter()
        self._last = 0.0
        self._width = 0

    def update(self, done: int, extra: str = "") -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        elapsed = now - self.t0
        eta = f", ETA {_duration(elapsed / done * (self.total - done))}" \
            if 0 < done < self.total else ""
        unit = f" {self.unit}" if self.unit else ""
        line = (f"{self.label}: {done}/{self.total}{unit} {100 * done // self.total}%"
                f"{extra}{eta}")
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)

    def close(self) -> None:
        """Erase the line (what follows starts at the left margin)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        self._width = 0


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds} s"
    m, s = divmod(seconds, 60)
    return f"{m} min {s:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def process_escapes(text: str) -> str:
    """llama.cpp's ``-e``: \\n \\r \\t \\' \\" \\\\ and \\xHH (a byte: \\xC3\\xA9 is é)
    become what they name; any other backslash stays as it is."""
    out, i = bytearray(), 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in _ESCAPES:
                out += _ESCAPES[nxt].encode()
                i += 2
                continue
            hexa = text[i + 2:i + 4]
            if nxt == "x" and len(hexa) == 2 and all(h in "0123456789abcdefABCDEF" for h in hexa):
                out.append(int(hexa, 16))
                i += 4
                continue
        out += c.encode("utf-8", "surrogatepass")
        i += 1
    return out.decode("utf-8", "replace")


# the commands that keep every core busy while they work
BUSY_COMMANDS = ("run", "chat", "bench", "perplexity", "serve", "embed", "quantize")


def other_gguflm_processes(proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, "gguflm COMMAND") of the other running gguflm processes that work the cores
    (Linux: read from /proc; elsewhere none are found)."""
    found = []
    me = {os.getpid(), os.getppid()}
    for entry in proc.glob("[0-9]*"):
        try:
            pid = int(entry.name)
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
        if pid in me:
            continue
        for i, word in enumerate(argv[:-1]):
            starts = word == "gguflm.cli" and i > 0 and argv[i - 1] == "-m"
            if (starts or os.path.basename(word) == "gguflm") and argv[i + 1] in BUSY_COMMANDS:
                found.append((pid, f"gguflm {argv[i + 1]}"))
                break
    return sorted(found)


def note_shared_cores(args: argparse.Namespace) -> None:
    """On a terminal, one note when another gguflm process works the same cores: both then
    run at a fraction of their speed (each sizes its threads to every core)."""
    if not sys.stderr.isatty() or getattr(args, "log_disable", False):
        return
    others = other_gguflm_processes()
    if others:
        pid, what = others[0]
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        print(f"note: another gguflm process is running ({what}, pid {pid}{more}); while it "
              f"works, both share the {os.cpu_count()} cores and run slower (-t N gives "
              f"each a part)", file=sys.stderr, flush=True)


def say_if_compiling() -> None:
    """One line on stderr when the kernels are not compiled yet (the first product then
    compiles them, once), so a silent pause is explained."""
    from ..model.base import compiled

    if not compiled():
        print("gguflm: first run on this machine: compiling the kernels, once ...",
              file=sys.stderr, flush=True)


def add_lookup_option(p: argparse.ArgumentParser) -> None:
    """``--lookup K``: prompt-lookup speculative decoding (engine/lookup.py)."""
    from ..engine.lookup import check_lookup

    def lookup(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        try:
            return check_lookup(n)
        except ValueError as e:  # out of range
            raise argparse.ArgumentTypeError(str(e)) from None

    p.add_argument("--lookup", type=lookup, default=0, metavar="K",
                   help="draft up to K tokens per step from the prompt and the text so far, "
                        "verified in one pass: faster when the reply repeats its input "
                        "(rewriting, editing), the same text (default: 0, off)")


def add_constraint_options(p: argparse.ArgumentParser) -> None:
    """Structured output: ``--json-schema``, ``--grammar``, ``--regex`` (at most one)."""
    g = p.add_argument_group("structured output (at most one; every token kept valid)")
    g.add_argument("-j", "--json-schema", metavar="FILE_OR_JSON",
                   help="the output is JSON matching this schema (JSON text, or a file)")
    g.add_argument("-jf", "--json-schema-file", metavar="FILE",
                   help="the same, the schema read from FILE")
    g.add_argument("--grammar", metavar="GBNF",
                   help="the output is a sentence of this GBNF (or Lark) grammar: its text, "
                        "or a file (llama.cpp's grammars/*.gbnf work unchanged)")
    g.add_argument("--grammar-file", metavar="FILE",
                   help="the same, the grammar read from FILE")
    g.add_argument("--regex", metavar="RE", help="the output fully matches this expression")


def constraint_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The API's constraint keywords from ``add_constraint_options``' options, files read
    here (textfiles.py's caps), checked as far as they can be without the model (syntax,
    size: ``check_constraint``) so that a bad one is refused before the model loads; a
    CLIError naming the option and the problem."""
    from .textfiles import is_existing_path

    schemas = [(opt, v) for opt, v in (("--json-schema", args.json_schema),
                                       ("--json-schema-file", args.json_schema_file))
               if v is not None]
    grammars = [(opt, v) for opt, v in (("--grammar", args.grammar),
                                        ("--grammar-file", args.grammar_file))
                if v is not None]
    if len(schemas) + len(grammars) + (args.regex is not None) > 1:
        raise CLIError("give at most one of --json-schema, --grammar and --regex")
    spec: dict[str, Any] = {}
    given = "--regex"  # the option (and file) the constraint came from, for errors
    for option, value in schemas:
        is_file = not value.strip().startswith("{")  # else JSON text
        given = f"{option} {value}" if is_file else option
        text = read_text(value, option=option) if is_file else value
        spec["json_schema"] = _schema(text, given)
    for option, value in grammars:
        # --grammar: a file if something exists at that path (read, or refused, as one)
        is_file = option == "--grammar-file" or is_existing_path(value)
        spec["grammar"] = read_text(value, option=option) if is_file else value
        given = f"{option} {value}" if is_file else option
    if args.regex is not None:
        spec["regex"] = args.regex
    check_constraint(spec, given)
    return spec


def _schema(text: str, given: str) -> Any:
    """A schema from its JSON text (``given``: the option and file, for errors)."""
    from ..engine.errors import InvalidRequestError
    from ..engine.schema import load_schema

    try:
        return load_schema(text, "json_schema")
    except InvalidRequestError as e:
        raise CLIError(f"{given}: {e}") from None


def check_constraint(spec: dict[str, Any], given: str | None = None) -> None:
    """Check ``constraint_spec``'s keywords without a vocabulary (the grammar's syntax and
    size, the schema's keywords), before any model loads: a CLIError naming the option
    (``given``: the option and file it came from)."""
    if not spec:
        return
    from ..engine.errors import InvalidRequestError
    from ..engine.grammar import constraint_from_request

    try:
        constraint_from_request(**spec)
    except InvalidRequestError as e:
        raise _constraint_error(e, given) from None


def make_constraint(spec: dict[str, Any], tokenizer: Any) -> Any:
    """The engine's Constraint for ``constraint_spec``'s keywords (None: none); CLIError
    naming the problem for a schema or grammar that cannot be enforced."""
    if not spec:
        return None
    from ..engine.constraints import Constraint
    from ..engine.errors import InvalidRequestError
    from ..engine.grammar import constraint_from_request

    try:
        return Constraint(constraint_from_request(**spec, tokenizer=tokenizer), tokenizer)
    except InvalidRequestError as e:
        raise _constraint_error(e) from None


def _constraint_error(e: Any, given: str | None = None) -> CLIError:
    """An engine error about a constraint, naming the option (``--json-schema``) or
    ``given``."""
    option = given or f"--{(e.param or 'grammar').split('.')[0].replace('_', '-')}"
    return CLIError(f"{option}: {e}")
