"""What every model-exact tokenizer is: the contract the families implement and the ingest step,
the CLI and the Python API use.

Exactness contract (docs/tokenizers.md): for a tokenizer built from a GGUF vocabulary,
`encode(text)` is exactly `llama_tokenize(vocab, text, add_special=false, parse_special=false)`
of llama.cpp; for one built from a `tokenizer.json`, exactly Hugging Face `tokenizers`'
`encode(text, add_special_tokens=False).ids`. Text that looks like a special token is text.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError

G = "tokenizer"
TOKENIZER_UNSUPPORTED = codes.define(
    "TOKENIZER_UNSUPPORTED",
    "A model tokenizer's family or pre-tokenizer is one matrixctl does not implement exactly "
    "(it is named; nothing is approximated).",
    group=G,
)
TOKENIZER_VOCAB = codes.define(
    "TOKENIZER_VOCAB",
    "A model tokenizer's vocabulary data is missing, of the wrong type or inconsistent (the "
    "key or field is named).",
    group=G,
)
TOKENIZER_ID = codes.define(
    "TOKENIZER_ID", "A token id to decode is outside the model's vocabulary.", group=G
)
TOKENIZER_TEXT = codes.define(
    "TOKENIZER_TEXT",
    "Text for a model tokenizer is not UTF-8 (the byte offset is named), or larger than one "
    "document may be.",
    group=G,
)
TOKENIZER_DECODE_UTF8 = codes.define(
    "TOKENIZER_DECODE_UTF8",
    "Decoded ids do not make valid UTF-8 text (--errors replace gives U+FFFD).",
    group=G,
)

# GGUF token types (llama.cpp's llama_token_type; tokenizer.ggml.token_type).
TYPE_UNDEFINED = 0
TYPE_NORMAL = 1
TYPE_UNKNOWN = 2
TYPE_CONTROL = 3
TYPE_USER_DEFINED = 4
TYPE_UNUSED = 5
TYPE_BYTE = 6


class ModelTokenizer(ABC):
    """A model's tokenizer. Subclasses set the attributes in their constructor.

    - `family`: "bpe" (byte-level BPE), "spm" (SentencePiece BPE), "wpm" (WordPiece),
      "ugm" (unigram), "gemma4" (BPE on raw UTF-8)
    - `pre`: the pre-tokenizer name (`tokenizer.ggml.pre`, or the tokenizer.json's), or None
    - `source`: "gguf" or "tokenizer.json" (whose behaviour `encode` follows)
    - `vocab_size`; `bos_id`, `eos_id`, `unk_id`, `pad_id` (None when the model has none);
      `add_bos`, `add_eos`: whether the model's metadata asks for them (`encode(...,
      add_special=True)` adds them).
    """

    family: str
    pre: str | None
    source: str
    vocab_size: int
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False

    @abstractmethod
    def encode_ordinary(self, text: str) -> list[int]:
        """The ids of `text` with no special tokens added and none parsed."""

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for when decoded (raises TOKENIZER_ID)."""

    def encode(self, text: str, *, add_special: bool = False) -> list[int]:
        ids = self.encode_ordinary(text)
        if add_special:
            if self.add_bos and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def encode_batch(self, texts: Iterable[str], *, add_special: bool = False) -> list[list[int]]:
        return [self.encode(t, add_special=add_special) for t in texts]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of `ids`, token after token (subclasses refine: SentencePiece turns U+2581
        back into spaces and drops the leading one; WordPiece joins its pieces)."""
        return b"".join(self.token_bytes(int(i)) for i in ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def describe(self) -> dict[str, Any]:
        """What `inspect` shows of the tokenizer (JSON-able)."""
        return {
            "family": self.family,
            "pre_tokenizer": self.pre,
            "source": self.source,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "unk_id": self.unk_id,
            "pad_id": self.pad_id,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.family}/{self.pre} vocab_size={self.vocab_size}>"


def kv_get(
    kv: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...
) -> Any:
    """`kv[key]` checked to be of `kind`; a missing key gives `default`, or TOKENIZER_VOCAB when
    there is none."""
    if key not in kv:
        if default is ...:
            raise FormatError(TOKENIZER_VOCAB, f"missing key {key}", field=key)
        return default
    value = kv[key]
    if not isinstance(value, kind):
        raise FormatError(
            TOKENIZER_VOCAB, f"{key} is {type(value).__name__}, not the expected type", field=key
        )
    return value


def kv_list(
    kv: Mapping[str, Any], key: str, item: type | tuple[type, ...], n: int | None = None
) -> Sequence[Any]:
    """A list value of `kv` whose items are `item`s (and `n` of them when given)."""
    value = kv_get(kv, key, (list, tuple))
    if n is not None and len(value) != n:
        raise FormatError(TOKENIZER_VOCAB, f"{key} has {len(value)} items, expected {n}", field=key)
    kinds = item if isinstance(item, tuple) else (item,)
    if set(map(type, value)) <= set(kinds):  # the common case, at C speed (400k items: ms)
        return value
    for i, v in enumerate(value):
        if not isinstance(v, item) or (isinstance(v, bool) and item is not bool):
            raise FormatError(TOKENIZER_VOCAB, f"{key}[{i}] is {type(v).__name__}", field=key)
    return value
