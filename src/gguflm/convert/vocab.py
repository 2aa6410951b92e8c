"""Tokenizer keys from ``tokenizer.json`` / ``tokenizer_config.json``, as llama.cpp's converter
writes them: the token list and types (``get_vocab_base``), the pre-tokenizer name (the hash
of the check text's ids), and gguf-py's ``SpecialVocab`` (special ids, add_* flags, merges,
chat template, normaliser flags), in the converter's key order.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..gguf.types import ArrayType, ValueType
from .errors import ConvertError
from .pretok_hashes import CHECK_TEXT, PRE_BY_HASH

K = "tokenizer.ggml."
CONTROL, NORMAL, USER_DEFINED, UNUSED = 3, 1, 4, 5
MAX_JSON_BYTES = 256 << 20
MAX_VOCAB = 1 << 22  # tokens; the largest real vocabularies have about 260k
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
            "sep": "seperator_token_id", "pad": "padding_token_id",
            "mask": "mask_token_id", "eot": "eot_token_id", "eom": "eom_token_id"}
Keys = list[tuple[str, Any, Any]]  # (key, value, GGUF type)


def read_json(path: Path, required: bool = True) -> Any:
    """A JSON file of the checkpoint, or None when it is absent and not ``required``."""
    if not path.is_file():
        if required:
            raise ConvertError("missing: the checkpoint has no such file", path=str(path))
        return None
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ConvertError(f"over {MAX_JSON_BYTES >> 20} MiB of JSON", path=str(path))
        return json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConvertError(f"cannot read as JSON: {e}", path=str(path)) from None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def base_vocab(folder: Path, vocab_size: int | None) -> tuple[list[str], list[int], dict]:
    """Tokens and types from ``tokenizer.json`` (``get_vocab_base``) and the parsed JSON."""
    path = folder / "tokenizer.json"
    tj = read_json(path)
    vocab = _dict(_dict(tj).get("model")).get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise ConvertError("model.vocab is missing or not an object of token ids",
                           path=str(path))
    by_id: dict[int, str] = {}
    for text, tid in vocab.items():
        if not isinstance(tid, int) or tid < 0:
            raise ConvertError(f"token {text!r} has id {tid!r}", path=str(path))
        by_id[tid] = text
    added: dict[int, dict] = {}
    for entry in tj.get("added_tokens") or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and \
                isinstance(entry.get("content"), str) and entry["id"] >= 0:
            by_id[entry["id"]] = entry["content"]
            added[entry["id"]] = entry
    n = vocab_size if vocab_size is not None else len(by_id)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_VOCAB:
        raise ConvertError(f"vocab_size {n!r} is not a vocabulary size (1..{MAX_VOCAB})",
                           path=str(folder / "config.json"))
    if max(by_id) >= n:
        raise ConvertError(f"token id {max(by_id)} is beyond vocab_size {n}", path=str(path))
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


def check_ids(tokenizer: Any) -> list[int]:
    return tokenizer.encode(CHECK_TEXT, add_special=True)


def special_vocab(folder: Path, n_vocab: int, load_merges: bool = False) -> Keys:
    """gguf-py's ``SpecialVocab(...).add_to_gguf``: the keys it writes, in its order."""
    sv = _SpecialVocab(n_vocab)
    tj = read_json(folder / "tokenizer.json", required=False)
    tc = read_json(folder / "tokenizer_config.json", required=False)
    sv.load_tokenizer(_dict(tj), dict(_dict(tc)) if tc is not None else None, load_merges)
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
        if isinstance(tj.get("normalizer"), dict):
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
