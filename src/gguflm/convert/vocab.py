"""Tokenizer keys from ``tokenizer.json`` / ``tokenizer_config.json``, as llama.cpp's converter
writes them: the token list and types (``get_vocab_base``), the pre-tokenizer name (the hash
of the check text's ids), and gguf-py's ``SpecialVocab`` (special ids, add_* flags, merges,
chat template, normaliser flags), in the converter's key order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..gguf.errors import GGUFError
from ..gguf.types import ArrayType, ValueType
from .errors import ConvertError
from .files import read_json
from .params import MAX_VOCAB
from .pretok_hashes import CHECK_TEXT, PRE_BY_HASH
from .schema import I64_MAX, Anything, Flag, Int, Later, ListOf, MapOf, Obj, OneOf, Text

K = "tokenizer.ggml."
CONTROL, NORMAL, USER_DEFINED, UNUSED = 3, 1, 4, 5
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
            "sep": "seperator_token_id", "pad": "padding_token_id",
            "mask": "mask_token_id", "eot": "eot_token_id", "eom": "eom_token_id"}
Keys = list[tuple[str, Any, Any]]  # (key, value, GGUF type)

# -- what is read of the tokenizer files (schema.py: null counts as absent) ------------------
TOKEN_ID = Int(0, I64_MAX)
_PIECE = Obj({"SpecialToken": Obj({"id": Text()}), "Sequence": Obj({"id": Text()})})
_PROCESSOR = {"type": Text(), "single": ListOf(_PIECE), "pair": ListOf(_PIECE),
              "cls": ListOf(OneOf((Text(), TOKEN_ID))), "sep": ListOf(OneOf((Text(), TOKEN_ID)))}
NORMALIZER = Obj({"type": Text(), "lowercase": Flag(), "strip_accents": Flag(),
                  "normalizers": ListOf(Later(lambda: NORMALIZER))})
TOKENIZER_JSON = Obj({
    "model": Obj({"vocab": MapOf(TOKEN_ID),
                  "merges": ListOf(OneOf((Text(), ListOf(Text(), min_len=2, max_len=2))))}),
    "added_tokens": ListOf(Obj({"id": TOKEN_ID, "content": Text(), "special": Flag()},
                               required=("id", "content"))),
    "normalizer": NORMALIZER,
    "post_processor": Obj({**_PROCESSOR, "processors": ListOf(Obj(_PROCESSOR))}),
})
_SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask", "eot", "eom")
TOKENIZER_CONFIG = Obj({
    "chat_template": OneOf((Text(), ListOf(Anything()))),  # a list of named templates: unused
    **{f"add_{t}_token": Flag() for t in _SPECIAL_TYPES},
    **{f"{t}_token": OneOf((Text(), Obj({"content": Text()}))) for t in _SPECIAL_TYPES},
})


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def tokenizer_json(folder: Path, required: bool = True) -> dict | None:
    """``tokenizer.json``, its fields checked (an error names the file and the field)."""
    return read_json(folder / "tokenizer.json", required, schema=TOKENIZER_JSON)


def n_vocab_real(folder: Path) -> int:
    """The tokens of ``tokenizer.json``: its vocab plus the added tokens (even those it
    repeats), as Gemma 3's converter counts them."""
    tj = tokenizer_json(folder)
    return len((tj.get("model") or {}).get("vocab") or {}) + len(tj.get("added_tokens") or [])


def base_vocab(folder: Path, vocab_size: int | None) -> tuple[list[str], list[int], dict]:
    """Tokens and types from ``tokenizer.json`` (``get_vocab_base``) and the parsed JSON.
    ``vocab_size`` is config.json's (checked there), else the tokenizer's own count."""
    path = folder / "tokenizer.json"
    tj = tokenizer_json(folder)
    vocab = (tj.get("model") or {}).get("vocab")
    if not vocab:
        raise ConvertError("missing or empty: the token ids", path=str(path), key="model.vocab")
    by_id: dict[int, str] = {tid: text for text, tid in vocab.items()}
    added: dict[int, dict] = {}
    for entry in tj.get("added_tokens") or []:
        by_id[entry["id"]] = entry["content"]
        added[entry["id"]] = entry
    n = vocab_size if vocab_size is not None else len(by_id)
    if not 0 < n <= MAX_VOCAB:
        raise ConvertError(f"{n} tokens; at most {MAX_VOCAB} are supported", path=str(path),
                           key="model.vocab")
    if max(by_id) >= n:
        raise ConvertError(f"token id {max(by_id)} is beyond vocab_size {n}", path=str(path),
                           key="model.vocab" if max(by_id) in vocab.values() else
                           "added_tokens")
    tokens, types = [], []
    for i in range(n):
        text = by_id.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            special = added[i].get("special") or _looks_special(text)
            if not special:
                text = text.replace("\u2581", " ")
            tokens.append(text)
            types.append(CONTROL if special else USER_DEFINED)
        else:
            tokens.append(text)
            types.append(NORMAL)
    return tokens, types, tj


def _looks_special(text: str) -> bool:
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


def pre_name(ids: list[int], path: Path) -> str:
    """``tokenizer.ggml.pre`` for the check text's ids, as the converter looks it up."""
    digest = hashlib.sha256(str(ids).encode()).hexdigest()
    name = PRE_BY_HASH.get(digest)
    if name is None:
        raise ConvertError(f"the pre-tokenizer is not one llama.cpp knows (check-text hash "
                           f"{digest[:16]}...)", path=str(path))
    return name


@contextmanager
def tokenizer_errors(folder: Path) -> Iterator[None]:
    """gguflm's tokenizer refusing the vocabulary it was given (to find ``pre``): an error
    of ``tokenizer.json``, where the vocabulary came from."""
    try:
        yield
    except ConvertError:
        raise
    except GGUFError as e:
        where = f" (as GGUF {e.key})" if e.key else ""
        raise ConvertError(f"gguflm's tokenizer cannot use this vocabulary{where}: "
                           f"{e.reason}", path=str(folder / "tokenizer.json")) from None


def check_ids(tokenizer: Any) -> list[int]:
    return tokenizer.encode(CHECK_TEXT, add_special=True)


def special_vocab(folder: Path, n_vocab: int, load_merges: bool = False) -> Keys:
    """gguf-py's ``SpecialVocab(...).add_to_gguf``: the keys it writes, in its order."""
    sv = _SpecialVocab(n_vocab)
    tj = tokenizer_json(folder, required=False)
    tc = read_json(folder / "tokenizer_config.json", required=False, schema=TOKENIZER_CONFIG)
    sv.load_tokenizer(tj or {}, dict(tc) if tc is not None else None, load_merges)
    # only the special ids, taken when they are in-range integers (gguf-py's leniency:
    # Llama 3's eos_token_id is a list, skipped as there)
    sv.load_config(_dict(read_json(folder / "config.json", required=False)))
    return sv.keys()


class _SpecialVocab:
    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self.types = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"]
        self.ids: dict[str, int] = {}
        self.add: dict[str, bool] = {}
        self.merges: list[str] = []
        self.chat_template: Any = None
        self.lowercase: bool | None = None
        self.strip_accents: bool | None = None

    def set_id(self, typ: str, tid: Any) -> None:
        if isinstance(tid, int) and not isinstance(tid, bool) and 0 <= tid < self.n_vocab:
            self.ids.setdefault(typ, tid)

    def normalizer(self, norm: dict, depth: int = 0) -> None:
        kind = norm.get("type")
        if kind == "Lowercase":
            self.lowercase = True
        elif kind == "StripAccents":
            self.strip_accents = True
        elif kind == "BertNormalizer":
            if "lowercase" in norm:
                self.lowercase = norm["lowercase"]
            if "strip_accents" in norm:
                self.strip_accents = norm["strip_accents"]
        elif kind == "Sequence" and depth < 8:
            for sub in norm.get("normalizers") or []:
                self.normalizer(_dict(sub), depth + 1)

    def load_tokenizer(self, tj: dict, tc: dict | None, load_merges: bool) -> None:
        if load_merges:
            self.merges = _merges(_dict(tj.get("model")).get("merges"))
        if tj.get("normalizer") is not None:
            self.normalizer(tj["normalizer"])
        added = [a for a in tj.get("added_tokens") or [] if isinstance(a, dict)]
        if tj:
            _post_processor(self, _dict(tj.get("post_processor")), tc)
        if not tc:
            return
        template = tc.get("chat_template")
        if isinstance(template, str):
            self.chat_template = template
        for typ in list(self.types):
            flag = tc.get(f"add_{typ}_token")
            if isinstance(flag, bool):
                self.add.setdefault(typ, flag)
            entry = tc.get(f"{typ}_token")
            content = entry.get("content") if isinstance(entry, dict) else entry
            if isinstance(content, str):
                self.set_id(typ, next((a.get("id") for a in added
                                       if a.get("content") == content), None))

    def load_config(self, config: dict) -> None:
        for typ in self.types:
            tid = config.get(f"{typ}_token_id")
            if tid is None and isinstance(config.get("text_config"), dict):
                tid = config["text_config"].get(f"{typ}_token_id")
            self.set_id(typ, tid)

    def keys(self) -> Keys:
        out: Keys = []
        if self.merges:
            out.append((K + "merges", self.merges, ArrayType(ValueType.STRING)))
        out += [(K + _ID_KEYS[t], i, ValueType.UINT32) for t, i in self.ids.items()
                if t in _ID_KEYS]
        out += [(K + f"add_{t}_token", v, ValueType.BOOL) for t, v in self.add.items()
                if t in ("bos", "eos", "sep")]
        if self.chat_template is not None:
            out.append((K.replace(".ggml.", ".") + "chat_template", self.chat_template,
                        ValueType.STRING))
        if self.lowercase is not None:
            out.append((K + "normalizer.lowercase", bool(self.lowercase), ValueType.BOOL))
        if self.strip_accents is not None:
            out.append((K + "normalizer.strip_accents", bool(self.strip_accents),
                        ValueType.BOOL))
        return out


def _merges(merges: Any) -> list[str]:
    if not isinstance(merges, list) or not merges:
        return []
    if isinstance(merges[0], str):
        return [m for m in merges if isinstance(m, str)]
    # transformers >= 4.45: [a, b] pairs; spaces inside are written as U+0120 (space + 256)
    return [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part)
                     for part in pair) for pair in merges
            if isinstance(pair, list) and len(pair) == 2]


def _post_processor(sv: _SpecialVocab, pp: dict, tc: dict | None) -> None:
    """The add_bos/eos/sep flags gguf-py reads from the tokenizer's post-processor."""
    tc = tc if tc is not None else {}
    bos, cls, eos, sep = (tc.get(k) for k in ("bos_token", "cls_token", "eos_token",
                                              "sep_token"))
    if not bos and cls and tc:
        tc["bos_token"] = bos = cls
    if not eos and sep and tc:
        tc["eos_token"] = eos = sep
    for proc in pp.get("processors") or [pp] if pp else []:
        kind = _dict(proc).get("type")
        if kind == "ByteLevel":
            sv.add.setdefault("bos", False)
            sv.add.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            sv.add.update(bos=True, eos=True, sep=True)
            if not cls and tc:
                tc["cls_token"] = cls = (proc.get("cls") or [bos])[0]
            if not sep and tc:
                tc["sep_token"] = sep = (proc.get("sep") or [eos])[0]
        elif kind == "TemplateProcessing":
            bos, eos = _template(sv, proc, tc, bos, cls, eos, sep)


def _special_id(item: Any) -> Any:
    return _dict(_dict(item).get("SpecialToken")).get("id")


def _template(sv: _SpecialVocab, proc: dict, tc: dict, bos: Any, cls: Any, eos: Any,
              sep: Any) -> tuple[Any, Any]:
    """gguf-py's crude reading of a TemplateProcessing (simple templates only)."""
    single, pair = proc.get("single") or [], proc.get("pair") or []
    first = last = None
    if len(single) > 1:
        if first := _special_id(single[0]):
            if not tc:
                bos = first
            elif first not in (bos, cls):
                if not bos:
                    tc["bos_token"] = bos = first
                if not cls:
                    tc["cls_token"] = cls = first
            sv.add["bos"] = first in (bos, cls)
        if last := _special_id(single[-1]):
            if not tc:
                eos = last
            elif last != eos:
                for extra in ("eot", "eom"):
                    if extra not in sv.types:
                        sv.types.append(extra)
                        tc[f"{extra}_token"] = eos
                        break
                tc["eos_token"] = eos = last
            sv.add["eos"] = last == eos
    if pair:
        start = 1 if first and _special_id(pair[0]) == first else 0
        stop = -1 if last and _special_id(pair[-1]) == last else None
        mid = pair[start:stop]
        a = _dict(_dict(mid[0]).get("Sequence")).get("id") if mid else None
        b = _dict(_dict(mid[-1]).get("Sequence")).get("id") if mid else None
        if a == "A" and b == "B" and (mid := mid[1:-1]):
            add_sep = False
            entry = _special_id(mid[0])
            if entry and entry in (sep, eos) and not last:
                add_sep = True
            if len(mid) == 2 and (entry := _special_id(mid[1])) and entry in (sep, eos):
                add_sep = True
            sv.add["sep"] = add_sep
            if add_sep and not sep and tc:
                tc["sep_token"] = eos
    return bos, eos
