"""Pre-tokenizers for byte-level BPE: the regex table, chosen by ``tokenizer.ggml.pre``.

Two tables, as in llama.cpp (src/llama-vocab.cpp):

- ``SPLITS``: a pre-tokenizer kind -> the regexes applied one after another. Each regex splits
  every piece left by the previous one; text between matches stays a piece of its own.
- ``PRE_NAMES``: the ``tokenizer.ggml.pre`` string -> a ``PreTokenizer`` (its kind plus the
  vocabulary flags that llama.cpp sets along with it).

Adding a pre-tokenizer is one ``PRE_NAMES`` entry (plus one ``SPLITS`` entry for new regexes).

Regexes are written in llama.cpp's dialect and run the way llama.cpp runs them: a regex that
uses ``\\p{..}`` classes runs on the *collapsed* text (see ``unicode_data``), with each class
rewritten to its stand-in plus its ASCII members; the others run on the text with non-ASCII
whitespace replaced by ``\\v``. ``\\s``, ``\\d``, ``\\w`` and ``\\b`` are ASCII-only, as in
std::regex. llama.cpp's hand-written fast paths for the GPT-2, Llama 3, Qwen2 and Qwen3.5
regexes compute the same splits as these regexes on the collapsed text; the two splitters it
has no regex for (AFMoE's digit grouping, also used for Tiny Aya) are functions here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import regex

from .unicode_data import ASCII_CLASS, LETTER, MARK, NUMBER, PUNCT, SYMBOL, collapse, widen

# --- the regexes (llama.cpp's dialect) -------------------------------------------------------

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
JAIS2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
         r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
_UPPERISH = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWERISH = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CASED_WORDS = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPERISH}*{_LOWERISH}+{_CONTRACTIONS}?"
                rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPERISH}+{_LOWERISH}*{_CONTRACTIONS}?")
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LOOKAHEAD_CASED = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
                    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*")
_LOOKAHEAD_CASED_C = (rf"[^\r\n\p{{L}}\p{{N}}]?((?=[\p{{L}}])([^a-z]))*((?=[\p{{L}}])([^A-Z]))+"
                      rf"{_CONTRACTIONS}?"
                      rf"|[^\r\n\p{{L}}\p{{N}}]?((?=[\p{{L}}])([^a-z]))+((?=[\p{{L}}])([^A-Z]))*"
                      rf"{_CONTRACTIONS}?")
_LOOKAHEAD_CASED_M = _LOOKAHEAD_CASED_C.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
_CJK_KANA = "[一-龥\u3040-ゟ゠-ヿ]+"
_DEEPSEEK3_MAIN = ('[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+'
                   r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_LATIN = (  # \u escapes: these differ from their canonical look-alikes
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛ"
    "ὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲ"
    "ⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+")
_DEEPSEEK_CJK = "[一-龥ࠀ-一가-\ud7ff]+"
_SENTENCE_PIECES = r" ?[^(\s|.,!?…。，、।۔،)]+"
_NEWLINE_RUNS = r"[^\n]+|[\n]+"
AFMOE_DIGITS = r"\p{AFMoE_digits}"  # not a regex: names the digit-grouping function below
TINY_AYA_DIGITS = r"\d{1,3}(?=(?:\d{3})*\b)"  # llama.cpp runs AFMoE's function for it

SPLITS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "gpt2": (GPT2,),
    "starcoder": (r"\p{N}", GPT2),  # also smollm, refact, command-r, codeshell, exaone, ...
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),  # also dbrx, smaug, chatglm4
    "jais2": (JAIS2,),
    "qwen2": (QWEN2,),  # also stablelm2, hunyuan, solar-open, grok-2
    "qwen35": (QWEN35,),
    "deepseek-llm": ("[\r\n]", _DEEPSEEK_LATIN, "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+", r"\s+$",
                     _DEEPSEEK_CJK, r"\p{N}+"),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, r"\p{N}"),
    "deepseek3": (r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3_MAIN),
    "spark2_5": (r"\p{N}{1,3}", _CJK_KANA,
                 "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
                 r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
                 r"\p{N}"),
    "youtu": ("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|" + _CJK_KANA,
              _CASED_WORDS + r"|\p{N}" + _TAIL),
    "poro": (_SENTENCE_PIECES,),  # also bloom, gpt3-finnish
    "viking": (_SENTENCE_PIECES, r"\p{N}"),
    "tekken": (_LOOKAHEAD_CASED + r"|\p{N}" + _TAIL,),
    "chameleon": ("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                  "([\\t\\n]|    |  )", r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2),
    "gpt4o": (_LOOKAHEAD_CASED_C + r"|\p{N}{1,3}" + _TAIL,),  # also minimax-m2
    "granite-emb-multi": (_LOOKAHEAD_CASED_M + r"|\p{N}{1,3}" + _TAIL,),
    "tiny_aya": (TINY_AYA_DIGITS, _CASED_WORDS + r"|\p{N}{1,3}" + _TAIL),
    "superbpe": (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+",),
    "afmoe": (AFMOE_DIGITS,
              "[一-鿿㐀-䶿豈-\ufaff\u3040-ゟ゠-ヿ･-ﾟ⼀-\u2fdfเ-\u0e7f\u0e80-\u0effក-\u17ffက-႟ꩠ-ꩿꧠ-\ua9ff"
              "가-\ud7afᄀ-ᇿ]+",
              _DEEPSEEK3_MAIN),
    "laguna": (_NEWLINE_RUNS, QWEN2),
    "exaone-moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "gemma4": (_NEWLINE_RUNS,),  # SentencePiece-style BPE: spaces are already U+2581
    "sarvam-moe": (_NEWLINE_RUNS,),
    "whitespace": (r"\S+",),
}

# kinds whose BPE runs on raw UTF-8 rather than GPT-2's byte alphabet
RAW_UTF8_KINDS = frozenset({"gemma4", "sarvam-moe", "whitespace"})


@dataclass(frozen=True)
class PreTokenizer:
    """A ``tokenizer.ggml.pre`` value: its split kind and the vocabulary flags that go with it.

    ``add_bos`` is the family's default (metadata ``add_bos_token`` still wins);
    ``clean_spaces`` is clean_up_tokenization_spaces, used by ``Tokenizer.detokenize``.
    """

    kind: str
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False
    escape_whitespaces: bool = False
    no_bos: bool = False  # the family has no BOS token unless the metadata names one


def _entries() -> dict[str, PreTokenizer]:
    P = PreTokenizer
    keep, llama3 = P("gpt2"), P("llama3", ignore_merges=True, add_bos=True)
    table: list[tuple[tuple[str, ...], PreTokenizer]] = [
        (("default",), P("default")),
        (("minicpm5",), P("minicpm5", ignore_merges=True)),
        (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
          "lfm2", "jina-v5-nano"), llama3),
        (("deepseek-llm",), P("deepseek-llm", clean_spaces=False)),
        (("deepseek-coder",), P("deepseek-coder", clean_spaces=False)),
        (("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"),
         P("deepseek3", clean_spaces=False)),
        (("spark2_5",), P("spark2_5", clean_spaces=False)),
        (("youtu",), P("youtu", clean_spaces=False, ignore_merges=True)),
        (("falcon",), P("falcon")),
        (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
          "a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe",
          "mpt", "olmo", "jais", "exaone4"), keep),
        (("starcoder", "refact", "codeshell", "exaone", "minerva-7b",
          "mellum2"), P("starcoder")),
        (("command-r", "smollm"), P("starcoder", clean_spaces=False)),
        (("jais-2",), P("jais2")),
        (("gemma4", "granite-embed-multi-311m"), P("gemma4", escape_whitespaces=True)),
        (("sarvam-moe",), P("sarvam-moe", escape_whitespaces=True, clean_spaces=False)),
        (("whitespace",), P("whitespace")),
        (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"),
         P("qwen2", clean_spaces=False)),
        (("megrez", "stablelm2"), P("qwen2")),
        (("qwen35",), P("qwen35", clean_spaces=False)),
        (("dbrx", "smaug-bpe"), P("llama3")),
        (("poro-chat",), P("poro", clean_spaces=False)),
        (("bloom", "gpt3-finnish"), P("poro")),
        (("chatglm-bpe",), P("llama3", no_bos=True)),
        (("glm4", "glm5"), P("llama3", no_bos=True, ignore_merges=True)),
        (("viking",), P("viking", clean_spaces=False)),
        (("tekken",), P("tekken", clean_spaces=False, ignore_merges=True, add_bos=True)),
        (("chameleon",), P("chameleon", clean_spaces=False, add_bos=True)),
        (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), P("gpt4o", clean_spaces=False)),
        (("granite-embed-multi-97m",),
         P("granite-emb-multi", clean_spaces=False, ignore_merges=True)),
        (("tiny_aya", "cohere2moe"), P("tiny_aya", clean_spaces=False)),
        (("superbpe",), P("superbpe", clean_spaces=False)),
        (("trillion", "granite-docling"), P("gpt2", clean_spaces=False)),
        (("bailingmoe", "bailingmoe2", "llada-moe"), P("bailingmoe", clean_spaces=False)),
        (("seed-coder",), P("seed-coder", clean_spaces=False)),
        (("hunyuan", "solar-open", "grok-2"), P("qwen2", clean_spaces=False)),
        (("ufakzeka",), P("ufakzeka", clean_spaces=False)),
        (("afmoe",), P("afmoe", clean_spaces=False)),
        (("laguna",), P("laguna", clean_spaces=False)),
        (("exaone-moe",), P("exaone-moe")),
    ]
    out: dict[str, PreTokenizer] = {}
    for names, pre in table:
        for name in names:
            out[name] = pre
    return out


PRE_NAMES: dict[str, PreTokenizer] = _entries()
# Known to llama.cpp but not implemented here (custom splitters with no regex equivalent).
UNSUPPORTED_PRE = frozenset({"kimi-k2"})


# --- running them ----------------------------------------------------------------------------

_CLASSES = {"N": NUMBER, "L": LETTER, "P": PUNCT, "M": MARK, "S": SYMBOL,
            "Lu": LETTER, "Ll": LETTER, "Lt": LETTER, "Lm": LETTER, "Lo": LETTER}


def _translate(expr: str) -> tuple[str, bool]:
    """llama.cpp regex -> (Python regex, runs on collapsed text?).

    ``\\p{X}`` becomes the class stand-in plus its ASCII members; ``$`` becomes ``\\Z``
    (std::regex's ``$`` never matches before a final newline); a ``[`` inside a set is escaped.
    """
    collapsed = any(f"\\p{{{c}}}" in expr for c in _CLASSES)
    if collapsed and not expr.isascii():
        raise ValueError(f"regex mixes \\p{{..}} classes with non-ASCII text: {expr!r}")
    out: list[str] = []
    in_set, i = False, 0
    while i < len(expr):
        c = expr[i]
        if c == "\\" and i + 1 < len(expr):
            if expr[i + 1] == "p" and expr.startswith("{", i + 2):
                end = expr.index("}", i + 3)
                cls = _CLASSES[expr[i + 3:end]]
                body = regex.escape(cls) + ASCII_CLASS[cls]
                out.append(body if in_set else f"[{body}]")
                i = end + 1
                continue
            out.append(expr[i:i + 2])
            i += 2
            continue
        if c == "[":
            out.append("\\[" if in_set else "[")
            in_set = True
        elif c == "]" and in_set:
            out.append("]")
            in_set = False
        elif c == "$" and not in_set:
            out.append(r"\Z")
        else:
            out.append(c)
        i += 1
    return "".join(out), collapsed


SplitFn = Callable[[str], list[int]]  # a piece (collapsed or widened) -> lengths of its parts


def _afmoe_digits(s: str) -> list[int]:
    """AFMoE's digit grouping, as llama.cpp computes it.

    Each run of numbers is cut into groups of three from the right (``1234567`` -> ``1``,
    ``234``, ``567``); the text before a run is not cut off but joins the run's first group.
    """
    out: list[int] = []
    prev = 0
    for m in _DIGIT_RUN.finditer(s):
        start, end = m.span()
        cut = start + (end - start) % 3
        if cut == start:
            cut += 3
        while cut <= end:
            out.append(cut - prev)
            prev = cut
            cut += 3
    if prev < len(s):
        out.append(len(s) - prev)
    return out


_DIGIT_RUN = regex.compile(f"[0-9{NUMBER}]+")


def _regex_splitter(pattern: regex.Pattern) -> SplitFn:
    def split(s: str) -> list[int]:
        out: list[int] = []
        last = 0
        for m in pattern.finditer(s):
            a, b = m.span()
            if a > last:
                out.append(a - last)
            out.append(b - a)  # zero-length matches only mark a cut; empty pieces are dropped
            last = b
        if last < len(s):
            out.append(len(s) - last)
        return out

    return split


@cache
def _compile(expr: str) -> tuple[SplitFn, bool]:
    if expr in (AFMOE_DIGITS, TINY_AYA_DIGITS):
        return _afmoe_digits, True
    pattern, collapsed = _translate(expr)
    return _regex_splitter(regex.compile(pattern, regex.ASCII | regex.V0)), collapsed


class PreSplitter:
    """Splits text into words with one pre-tokenizer kind's regexes."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.steps = [_compile(expr) for expr in SPLITS[kind]]

    def split(self, text: str) -> list[str]:
        """The words of ``text`` (never empty strings), in order; ''.join(words) == text."""
        if not text:
            return []
        views: dict[bool, str] = {}
        lengths = [len(text)]
        for step, collapsed in self.steps:
            view = views.get(collapsed)
            if view is None:
                view = views[collapsed] = collapse(text) if collapsed else widen(text)
            new: list[int] = []
            pos = 0
            for n in lengths:
                if n:
                    new.extend(step(view[pos:pos + n]))
                pos += n
            lengths = new
        words = []
        pos = 0
        for n in lengths:
            if n:
                words.append(text[pos:pos + n])
                pos += n
        return words


@cache
def splitter(kind: str) -> PreSplitter:
    """The (cached) splitter for a kind in ``SPLITS``."""
    return PreSplitter(kind)
