"""Build the bundled default π symbol map, matrixctl/data/pi_symbol_map.json (reproducibly).

    python tools/build_default_symbols.py [--gguf PATH] [-o OUT]

Recipe (docs/formats/pi-symbol-map.md, "The bundled default map"):

- ids 0 = unk and pad, 1 = end of document (eos), 2..257 = the 256 byte-fallback tokens;
- then, from id 258, every token of the GPT-2 vocabulary (OpenAI's GPT-2 tokenizer, released
  under a modified MIT license; read from the llama.cpp vocabulary-only test file
  ggml-vocab-gpt-2.gguf in fixtures/gguf) that decodes to valid UTF-8 and is unchanged by
  NFKC, in GPT-2 id order (so frequent pieces such as " the", "ing", "\n\n" come first);
- then single characters of other scripts, so they cost one token instead of two or three
  bytes: whole Unicode blocks for alphabets (Latin-1 and Latin Extended, Greek, Cyrillic,
  Armenian, Hebrew, Arabic, Devanagari, Bengali, Tamil, Thai, Georgian, kana, punctuation,
  arrows, math, box drawing) and, for Han and Hangul, the common-use sets of the national
  standards, read from Python's own codecs: GB 2312 level 1 (3,755 hanzi), JIS X 0208
  level 1 (2,965 kanji), Big5 level 1 (5,401 hanzi), KS X 1001 (2,350 Hangul syllables);
- every character is taken only if it is assigned (Unicode category not Cn) and NFKC-stable;
  the ids stop at 65,535 so every id fits uint16.

The character properties come from Python's unicodedata, so the recipe pins its Unicode
version (14.0.0, Python 3.11) and refuses to run under another one.
"""

from __future__ import annotations

import argparse
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = ROOT / "fixtures" / "gguf" / "ggml-vocab-gpt-2.gguf"
DEFAULT_OUT = ROOT / "matrixctl" / "data" / "pi_symbol_map.json"
UNICODE_VERSION = "14.0.0"
VOCAB_LIMIT = 1 << 16
UNK, EOS, BYTE_BASE, FIRST_SYMBOL = 0, 1, 2, 258

BLOCKS = [
    (0x00A0, 0x024F),  # Latin-1 Supplement, Latin Extended-A and -B
    (0x0370, 0x03FF),  # Greek and Coptic
    (0x0400, 0x04FF),  # Cyrillic
    (0x0530, 0x058F),  # Armenian
    (0x0590, 0x05FF),  # Hebrew
    (0x0600, 0x06FF),  # Arabic
    (0x0900, 0x097F),  # Devanagari
    (0x0980, 0x09FF),  # Bengali
    (0x0B80, 0x0BFF),  # Tamil
    (0x0E00, 0x0E7F),  # Thai
    (0x10A0, 0x10FF),  # Georgian
    (0x2000, 0x206F),  # General Punctuation
    (0x20A0, 0x20CF),  # Currency Symbols
    (0x2190, 0x22FF),  # Arrows, Mathematical Operators
    (0x2500, 0x257F),  # Box Drawing
    (0x3000, 0x30FF),  # CJK Symbols and Punctuation, Hiragana, Katakana
    (0xFF01, 0xFF5E),  # Fullwidth forms (NFKC maps most away; the stable ones stay)
]


def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted (the published algorithm)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def gpt2_symbols(gguf_path: Path) -> list[str]:
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields["tokenizer.ggml.tokens"]
    decoder = gpt2_byte_decoder()
    out = []
    for i in field.data:
        token = bytes(field.parts[i]).decode("utf-8")
        if token.startswith("<|") and token.endswith("|>"):
            continue  # special tokens such as <|endoftext|>
        try:
            text = bytes(decoder[c] for c in token).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue  # a piece of a multi-byte character: the byte fallback covers it
        out.append(text)
    return out


def national_sets() -> list[str]:
    """Common Han and Hangul characters, in each standard's own order."""
    out: list[str] = []
    # GB 2312 level 1: rows 16-55 (lead bytes 0xB0-0xD7), 94 cells each.
    for lead in range(0xB0, 0xD8):
        for trail in range(0xA1, 0xFF):
            out.extend(_decode(bytes([lead, trail]), "gb2312"))
    # JIS X 0208 level 1: rows 16-47 (EUC-JP lead bytes 0xB0-0xCF).
    for lead in range(0xB0, 0xD0):
        for trail in range(0xA1, 0xFF):
            out.extend(_decode(bytes([lead, trail]), "euc_jp"))
    # KS X 1001 Hangul syllables: rows 16-40 (EUC-KR lead bytes 0xB0-0xC8).
    for lead in range(0xB0, 0xC9):
        for trail in range(0xA1, 0xFF):
            out.extend(_decode(bytes([lead, trail]), "euc_kr"))
    # Big5 level 1 (frequently used hanzi): lead bytes 0xA4-0xC6.
    for lead in range(0xA4, 0xC7):
        for trail in [*range(0x40, 0x7F), *range(0xA1, 0xFF)]:
            out.extend(_decode(bytes([lead, trail]), "big5"))
    return out


def _decode(raw: bytes, codec: str) -> list[str]:
    try:
        text = raw.decode(codec)
    except UnicodeDecodeError:
        return []
    return [text] if len(text) == 1 else []


def block_chars() -> list[str]:
    return [chr(c) for lo, hi in BLOCKS for c in range(lo, hi + 1)]


def build(gguf_path: Path) -> bytes:
    sys.path.insert(0, str(ROOT))
    from matrixctl.tokenizers.pi import SymbolMap

    seen: set[str] = set()
    texts: list[str] = []
    for text in [*gpt2_symbols(gguf_path), *block_chars(), *national_sets()]:
        if text in seen or not text:
            continue
        if unicodedata.normalize("NFKC", text) != text:
            continue
        if any(unicodedata.category(c) == "Cn" for c in text):
            continue
        seen.add(text)
        texts.append(text)
    texts = texts[: VOCAB_LIMIT - FIRST_SYMBOL]
    symbols = tuple((FIRST_SYMBOL + n, t) for n, t in enumerate(texts))
    smap = SymbolMap(
        vocab_size=FIRST_SYMBOL + len(symbols),
        unk_id=UNK,
        pad_id=UNK,
        byte_fallback=True,
        byte_base_id=BYTE_BASE,
        normalization="nfkc",
        symbols=symbols,
        eos_id=EOS,
    )
    return smap.to_json_bytes()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("-o", "--output", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    if unicodedata.unidata_version != UNICODE_VERSION:
        sys.stderr.write(
            f"this recipe pins Unicode {UNICODE_VERSION} (Python 3.11); this Python has "
            f"{unicodedata.unidata_version}\n"
        )
        return 2
    data = build(args.gguf)
    args.output.write_bytes(data)
    sys.stderr.write(f"wrote {args.output} ({len(data):,} bytes)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
