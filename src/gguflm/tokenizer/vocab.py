"""The vocabulary from GGUF metadata: tokens, scores, attributes, special ids, flags.

Mirrors llama.cpp's ``llama_vocab::impl::load`` (src/llama-vocab.cpp): the defaults per
tokenizer model, the special-token ids and their range checks, the token attributes
(from ``tokenizer.ggml.token_type``, then corrected by token text exactly as llama.cpp
corrects them), and the end-of-generation set.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..gguf.errors import GGUFError
from .pretokenize import PRE_NAMES, UNSUPPORTED_PRE, PreTokenizer


class TokenizerError(GGUFError):
    """The tokenizer metadata is missing or invalid, or a request about tokens is (bad id)."""


class TokenType(enum.IntEnum):
    """``tokenizer.ggml.token_type`` values (llama.h's llama_token_type)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class Attr(enum.IntFlag):
    """Token attributes (llama.h's llama_token_attr), what the tokenizer actually uses."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# token_type -> attribute; anything else (0, 7) is UNDEFINED
_TYPE_TO_ATTR = np.zeros(8, dtype=np.int32)
for _t, _a in ((TokenType.UNKNOWN, Attr.UNKNOWN), (TokenType.UNUSED, Attr.UNUSED),
               (TokenType.NORMAL, Attr.NORMAL), (TokenType.CONTROL, Attr.CONTROL),
               (TokenType.USER_DEFINED, Attr.USER_DEFINED), (TokenType.BYTE, Attr.BYTE)):
    _TYPE_TO_ATTR[_t] = _a

K = "tokenizer.ggml."
SUPPORTED_MODELS = ("llama", "gpt2", "gemma4", "bert")

# Texts llama.cpp recognises as end-of-turn / FIM tokens when the metadata names none;
# the first one present is taken (llama.cpp takes whichever its hash map yields first).
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
             "<end_of_utterance>")
EOM_TEXTS = ("<|eom_id|>",)
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Every token with one of these texts ends generation (llama.cpp's special_eog_ids).
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
             "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
# gpt-oss: always rendered, so user-defined whatever the file says
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# metadata key -> special id name; the deprecated prefix/suffix/middle keys come last
SPECIAL_KEYS = (
    ("bos_token_id", "bos"), ("eos_token_id", "eos"), ("eot_token_id", "eot"),
    ("eom_token_id", "eom"), ("unknown_token_id", "unk"), ("seperator_token_id", "sep"),
    ("padding_token_id", "pad"), ("mask_token_id", "mask"), ("fim_pre_token_id", "fim_pre"),
    ("fim_suf_token_id", "fim_suf"), ("fim_mid_token_id", "fim_mid"),
    ("fim_pad_token_id", "fim_pad"), ("fim_rep_token_id", "fim_rep"),
    ("fim_sep_token_id", "fim_sep"), ("prefix_token_id", "fim_pre"),
    ("suffix_token_id", "fim_suf"), ("middle_token_id", "fim_mid"),
)


@dataclass
class Vocab:
    """Everything the tokenizer reads from metadata, with llama.cpp's defaults applied.

    ``kind`` is ``"spm"`` (SentencePiece, ``tokenizer.ggml.model = llama``), ``"wpm"``
    (WordPiece, ``bert``) or ``"bpe"``.
    ``special`` maps names (bos, eos, eot, eom, unk, sep, pad, mask, fim_*) to ids or None.
    ``scores`` (float32) and ``attrs`` (int32, one ``Attr`` bitmask per token) are numpy
    arrays: per-token Python objects would cost a 262k vocabulary ~10 MB more.
    ``special_ids`` are the ids split out of text before tokenizing (control, user-defined
    and unknown tokens), longest text first.
    """

    model: str
    kind: str
    tokens: list[str]
    token_to_id: dict[str, int]
    scores: np.ndarray
    attrs: np.ndarray
    special: dict[str, int | None]
    pre_name: str = ""
    pre: PreTokenizer | None = None
    merges: Sequence[str] = ()
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    clean_spaces: bool = False
    escape_whitespaces: bool = True
    add_sep: bool = False        # WordPiece: [SEP] closes the text (with add_special)
    lowercase: bool = True       # WordPiece normaliser (tokenizer.ggml.normalizer.*)
    strip_accents: bool = True
    eog_ids: frozenset[int] = frozenset()
    special_ids: list[int] = field(default_factory=list)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def _get(meta: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], default: Any = None,
         required: bool = False) -> Any:
    value = meta.get(key, None)
    if value is None:
        if required:
            raise TokenizerError("missing: the file has no tokenizer (vocabulary)", key=key)
        return default
    if not isinstance(value, kinds) or (kinds is int and isinstance(value, bool)):
        raise TokenizerError(f"invalid type {type(value).__name__}", key=key)
    return value


def _array(meta: Mapping[str, Any], key: str, n: int) -> np.ndarray | None:
    value = meta.get(key)
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "iuf":
        raise TokenizerError("expected a numeric array", key=key)
    if len(arr) < n:
        raise TokenizerError(f"has {len(arr)} entries for {n} tokens", key=key)
    return arr[:n]


def load_vocab(meta: Mapping[str, Any]) -> Vocab:
    """Build the vocabulary from a GGUF metadata mapping (``GGUFFile.metadata``)."""
    model = _get(meta, K + "model", str, required=True)
    if model not in SUPPORTED_MODELS:
        known = model in ("t5", "rwkv", "plamo2", "no_vocab", "none", "hybriddna",
                          "whitespace")
        what = "unsupported" if known else "unknown"
        raise TokenizerError(f"{what} tokenizer model {model!r} (supported: "
                             f"{', '.join(SUPPORTED_MODELS)})", key=K + "model")
    raw = meta.get(K + "tokens")
    if raw is None:
        raise TokenizerError("missing: the file has no vocabulary", key=K + "tokens")
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise TokenizerError("expected an array of strings", key=K + "tokens")
    tokens = raw.tolist() if hasattr(raw, "tolist") else list(raw)
    if tokens and not isinstance(tokens[0], str):
        raise TokenizerError("expected an array of strings", key=K + "tokens")
    n = len(tokens)
    if n == 0:
        raise TokenizerError("the vocabulary is empty", key=K + "tokens")
    token_to_id = dict(zip(tokens, range(n)))  # a repeated text maps to its last id
    if "" in token_to_id:  # llama.cpp renames empty tokens so that every text maps back
        for i, text in enumerate(tokens):
            if not text:
                tokens[i] = f"[EMPTY_{i}]"
                token_to_id[tokens[i]] = i
        del token_to_id[""]

    scores = _array(meta, K + "scores", n)
    # a float32 file array stays a view of the file (no copy)
    scores = (np.zeros(n, np.float32) if scores is None
              else np.ascontiguousarray(scores, dtype=np.float32))
    types = _array(meta, K + "token_type", n)
    if types is None:
        attrs_arr = np.full(n, int(Attr.NORMAL), dtype=np.int32)
    else:
        if types.dtype.kind == "f":
            types = types.astype(np.int64)
        # types outside 0..7 clip to 0 or 7, both UNDEFINED in the table (few temporaries)
        attrs_arr = _TYPE_TO_ATTR[np.clip(types, 0, 7)]

    pre_name = _get(meta, K + "pre", str, default="")
    special: dict[str, int | None] = dict.fromkeys(
        ["bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask",
         "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"])
    kind = {"llama": "spm", "bert": "wpm"}.get(model, "bpe")
    v = Vocab(model=model, kind=kind, tokens=tokens,
              token_to_id=token_to_id, scores=scores, attrs=attrs_arr, special=special)
    if model == "llama":
        special.update(bos=1, eos=2, unk=0)
        v.add_space_prefix, v.add_bos = True, True
    elif model == "bert":
        _load_wpm(meta, v, pre_name)
    else:
        _load_bpe(meta, v, pre_name)
    v.add_space_prefix = _get(meta, K + "add_space_prefix", bool, v.add_space_prefix)

    for key, name in SPECIAL_KEYS:  # llama.cpp: defaults out of range are disabled ...
        if special[name] is not None and special[name] >= n:
            special[name] = None
        new = meta.get(K + key)
        if isinstance(new, int | np.integer) and not isinstance(new, bool) and 0 <= new < n:
            special[name] = int(new)  # ... and an out-of-range metadata id is ignored
    v.add_bos = _get(meta, K + "add_bos_token", bool, v.add_bos)
    v.add_eos = _get(meta, K + "add_eos_token", bool, v.add_eos)
    v.add_sep = _get(meta, K + "add_sep_token", bool, v.add_sep)
    if v.pre is not None and v.pre.kind == "gemma4":
        v.add_bos = True  # llama.cpp forces BOS for Gemma 4 (pre-tokenizer kind gemma4 only)
    _detect_special(v, attrs_arr)
    _per_model_attrs(meta, v)
    return v


def _load_wpm(meta: Mapping[str, Any], v: Vocab, pre_name: str) -> None:
    """llama.cpp's WordPiece defaults; the pre-tokenizer name is recorded, not used."""
    v.special.update(bos=101, unk=100, sep=102, pad=0, mask=103)
    v.pre_name, v.clean_spaces, v.add_bos, v.add_sep = pre_name, True, True, True
    v.lowercase = _get(meta, K + "normalizer.lowercase", bool, True)
    v.strip_accents = _get(meta, K + "normalizer.strip_accents", bool, v.lowercase)


def _load_bpe(meta: Mapping[str, Any], v: Vocab, pre_name: str) -> None:
    merges = meta.get(K + "merges")
    if merges is None:
        raise TokenizerError("missing: a BPE vocabulary needs its merges", key=K + "merges")
    if isinstance(merges, str | bytes) or not isinstance(merges, Sequence):
        raise TokenizerError("expected an array of strings", key=K + "merges")
    v.merges = merges
    if v.model == "gemma4":
        pre_name = "gemma4"
    if pre_name in UNSUPPORTED_PRE:
        raise TokenizerError(f"pre-tokenizer {pre_name!r} is not supported", key=K + "pre")
    pre = PRE_NAMES.get(pre_name or "default")
    if pre is None:
        raise TokenizerError(f"unknown pre-tokenizer {pre_name!r}", key=K + "pre")
    v.pre_name, v.pre = pre_name or "default", pre
    v.clean_spaces = pre.clean_spaces
    v.escape_whitespaces = pre.escape_whitespaces
    v.add_bos = pre.add_bos
    if v.model == "gemma4":
        v.special.update(bos=None, eos=None)
    else:
        v.special.update(bos=11, eos=11)  # llama.cpp's (odd) BPE defaults
    if pre.no_bos:
        v.special["bos"] = None


def _detect_special(v: Vocab, attrs: np.ndarray) -> None:
    """llama.cpp's text-based fixes: EOT/EOM/FIM ids, unused and EOG tokens."""
    special, lookup = v.special, v.token_to_id

    control_bit = int(Attr.CONTROL)

    def mark_control(tid: int) -> None:
        attrs[tid] |= control_bit

    for name, texts in (("eot", EOT_TEXTS), ("eom", EOM_TEXTS), *FIM_TEXTS.items()):
        if special[name] is None:
            for text in texts:
                tid = lookup.get(text)
                if tid is not None:
                    special[name] = tid
                    mark_control(tid)
                    break
    # control tokens named "unused" are unused
    tokens, unused_bit = v.tokens, int(Attr.UNUSED)
    for tid in np.flatnonzero(attrs & control_bit).tolist():
        if "unused" in tokens[tid] and lookup.get(tokens[tid]) == tid:
            attrs[tid] |= unused_bit

    eog: set[int] = {special[k] for k in ("fim_pad", "fim_rep", "fim_sep")
                     if special[k] is not None}
    for text in EOG_TEXTS:
        tid = lookup.get(text)
        if tid is not None:
            eog.add(tid)
            mark_control(tid)
    for text in ALWAYS_RENDERED:
        tid = lookup.get(text)
        if tid is not None:
            attrs[tid] = Attr.USER_DEFINED
    eog.update(special[k] for k in ("eos", "eot", "eom") if special[k] is not None)
    by_text = {v.tokens[tid]: tid for tid in sorted(eog)}
    # harmony / solar-open: "<|end|>" ends a message, not the generation
    has_call = "<|call|>" in by_text or "<|calls|>" in by_text
    if "<|end|>" in by_text and has_call and ("<|return|>" in by_text or "<|flush|>" in by_text):
        end = by_text["<|end|>"]
        eog.discard(end)
        attrs[end] = Attr.USER_DEFINED
    # gemma4 and plamo have a normal "</s>"
    if "</s>" in by_text and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):
        s = by_text["</s>"]
        eog.discard(s)
        attrs[s] = Attr.NORMAL
    v.eog_ids = frozenset(eog)

    ids = np.flatnonzero(attrs & int(Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN)).tolist()
    # longest (in UTF-8 bytes) first, so that a token containing another is found first
    ids.sort(key=lambda t: -len(v.tokens[t].encode("utf-8", "surrogateescape")))
    v.special_ids = ids


def _per_model_attrs(meta: Mapping[str, Any], v: Vocab) -> None:
    """llama.cpp's LSTRIP/RSTRIP attributes, keyed by model name, architecture and pre."""
    name = str(meta.get("general.name", "")).lower()
    arch = str(meta.get("general.architecture", ""))
    pre = str(meta.get(K + "pre", ""))
    attrs, lookup = v.attrs, v.token_to_id

    def set_attr(text: str, attr: Attr, on: bool) -> None:
        tid = lookup.get(text)
        if tid is not None:
            attrs[tid] = (attrs[tid] | int(attr)) if on else (attrs[tid] & ~int(attr))

    if (any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code"))
            or any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3"))):
        set_attr("<mask>", Attr.LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for tid in v.special_ids:
            attrs[tid] |= int(Attr.RSTRIP)
        set_attr("</s>", Attr.RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, Attr.RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", Attr.LSTRIP, True)
