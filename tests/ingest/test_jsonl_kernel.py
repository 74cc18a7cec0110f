"""The compiled JSON Lines text-field extractor (matrixctl/_jsonl_kernel.c, docs/inputs.md "JSON
Lines records are scanned in C") and the normalization of UTF-8 texts beside it.

The extractor may only take a line that orjson takes, with exactly orjson's text (CRLF as LF);
every other line goes to the Python path. Checked three ways: each line the kernel takes is
parsed by orjson and compared; `jsonl_texts` (kernel and fallback) gives what the line reader
(`jsonl_texts_stream`, orjson and the standard library) gives, errors included, on generated
and mutated lines; and each reason to leave a line is pinned by a unit test."""

from __future__ import annotations

import os
import struct
import unicodedata
from functools import partial
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies

from matrixctl import _jsonl_kernel
from matrixctl.ingest.kinds import base as kinds_base
from matrixctl.ingest.kinds import jsonl as kinds_jsonl
from matrixctl.tokenizers import pi
from tests.ingest.test_ingest_batches import both

BIG = 1 << 28


def scan(data: bytes, field: bytes = b"text", limit: int = BIG) -> list[tuple[Any, ...]]:
    """The kernel's rows: (start, stop, kind, text bytes or None)."""
    out = bytearray(len(data) + 16)
    rows = _jsonl_kernel.texts(data, 0, len(data), field, limit, out)
    return [
        (a, b, kind, bytes(out[off : off + n]) if kind else None)
        for a, b, off, n, kind in struct.iter_unpack("5q", rows)
    ]


def check_taken(data: bytes, field: str = "text", limit: int = BIG) -> int:
    """Every line the kernel takes is one orjson takes with that text; the rows cover the
    buffer line by line. Returns how many lines it took."""
    rows = scan(data, field.encode("utf-8", "surrogatepass"), limit)
    pos = 0
    taken = 0
    for start, stop, kind, text in rows:
        assert start == pos and stop > start
        nl = data.find(b"\n", start)
        assert stop == (len(data) if nl < 0 else nl + 1)
        pos = stop
        if not kind:
            continue
        taken += 1
        line = data[start:stop]
        assert len(line.rstrip(b"\n")) <= limit
        obj = orjson.loads(line)  # raises if the kernel took a line orjson refuses
        assert isinstance(obj, dict) and isinstance(obj.get(field), str)
        want = obj[field].replace("\r\n", "\n")
        assert text == want.encode("utf-8")
        assert kind == (1 if want.isascii() else 2)
    assert pos == len(data)
    return taken


# Lines it takes --------------------------------------------------------------------------------

TAKEN = [
    (b'{"text": "plain"}\n', "plain"),
    (b'{"text":"a"}', "a"),  # no line feed at the end
    (b' \t{ "id" : 7 , "text" : "x" , "n" : [1, 2.5, -0.0e+3, {"a": null}] }\r\n', "x"),
    (b'{"text": "crlf\\r\\nline\\r\\n\\r\\r\\n"}\n', "crlf\nline\n\r\n"),
    (b'{"text": "\\u000d\\u000a \\r\\u000a"}\n', "\n \n"),
    (
        b'{"text": "esc \\" \\\\ \\/ \\b \\f \\t \\u0000 \\u00e9 \\u00C9"}\n',
        'esc " \\ / \b \f \t \0 é É',
    ),
    (b'{"text": "\\ud83d\\ude00 \\uD83D\\uDE00"}\n', "\U0001f600 \U0001f600"),
    (
        '{"text": "café 中文 \U0001f980 \ufffe \u2028 \x7f"}\n'.encode(),
        "café 中文 \U0001f980 \ufffe \u2028 \x7f",
    ),
    (b'{"text": ""}\n', ""),
    (b'{"a": {"text": 1}, "text": "top level only"}\n', "top level only"),
    (
        b'{"n": 123456789012345678901234567890, "text": "40 digits or fewer"}\n',
        "40 digits or fewer",
    ),
    (b'{"n": 1e200, "m": -1.5E-200, "text": "t"}\n', "t"),
    (b'{"x": "\\ud800\\udc00", "o": {"k\\u0065y": 1}, "text": "t"}\n', "t"),  # escapes elsewhere
    (b'{"deep": ' + b"[" * 64 + b"]" * 64 + b', "text": "t"}\n', "t"),
    (b'{"text": "' + b"0123456789abcdef" * 1000 + b'"}\n', "0123456789abcdef" * 1000),
]


@pytest.mark.parametrize(("line", "text"), TAKEN)
def test_it_takes_the_common_records_with_orjson_s_text(line: bytes, text: str) -> None:
    rows = scan(line)
    assert [r[2] for r in rows] == [1 if text.isascii() else 2]
    assert rows[0][3] == text.encode()
    assert check_taken(line) == 1


def test_the_field_is_compared_as_its_utf8_bytes() -> None:
    line = '{"text": "no", "тело": "yes"}\n'.encode()
    assert scan(line, "тело".encode())[0][3] == b"yes"
    assert scan(b'{"a.b": "literal key", "a": {"b": "nested"}}', b"a.b")[0][3] == b"literal key"
    assert scan(b'{"": "empty key"}', b"")[0][3] == b"empty key"


# Lines it leaves to the Python path, one reason each ---------------------------------------------

LEFT = {
    "blank": b"\n",
    "white space only": b" \t\r\n",
    "byte order mark": b'\xef\xbb\xbf{"text": "a"}\n',
    "not an object": b'["text", "a"]\n',
    "a string at the top": b'"text"\n',
    "no field": b'{"id": 1}\n',
    "empty object": b"{}\n",
    "field not a string": b'{"text": 7}\n',
    "field null": b'{"text": null}\n',
    "field an object": b'{"text": {"a": "b"}}\n',
    "field twice": b'{"text": "a", "text": "b"}\n',
    "escaped top-level key": b'{"te\\u0078t": "a"}\n',
    "escaped other top-level key": b'{"text": "a", "o\\u0074her": 1}\n',
    "lone high surrogate": b'{"text": "\\ud800"}\n',
    "lone high surrogate then text": b'{"text": "\\ud800x"}\n',
    "high surrogate then not low": b'{"text": "\\ud800\\u0041"}\n',
    "lone low surrogate": b'{"text": "\\udc00"}\n',
    "lone surrogate elsewhere": b'{"text": "a", "o": "\\udfff"}\n',
    "bad escape": b'{"text": "\\x41"}\n',
    "upper-case u escape": b'{"text": "\\U0041"}\n',
    "short unicode escape": b'{"text": "\\u41"}\n',
    "control character": b'{"text": "a\tb"}\n',
    "raw carriage return": b'{"text": "a\rb"}\n',
    "NUL": b'{"text": "a\x00b"}\n',
    "invalid UTF-8": b'{"text": "\xff"}\n',
    "overlong UTF-8": b'{"text": "\xc0\x80"}\n',
    "UTF-8 surrogate": b'{"text": "\xed\xa0\x80"}\n',
    "beyond U+10FFFF": b'{"text": "\xf4\x90\x80\x80"}\n',
    "truncated UTF-8": b'{"text": "\xe4\xb8"}\n',
    "invalid UTF-8 elsewhere": b'{"text": "a", "o": "\xfe"}\n',
    "unterminated string": b'{"text": "a\n',
    "unterminated object": b'{"text": "a"\n',
    "the line ends in the object": b'{"text": "a",\n"b": 1}\n',
    "trailing comma": b'{"text": "a",}\n',
    "trailing comma in array": b'{"text": "a", "b": [1,]}\n',
    "missing colon": b'{"text" "a"}\n',
    "data after the object": b'{"text": "a"} x\n',
    "two objects": b'{"text": "a"}{"text": "b"}\n',
    "form feed after": b'{"text": "a"}\x0c\n',
    "NBSP as white space": b'{"text":\xc2\xa0"a"}\n',
    "single quotes": b"{'text': 'a'}\n",
    "41 integer digits": b'{"n": 1' + b"0" * 40 + b', "text": "a"}\n',
    "41 fraction digits": b'{"n": 0.' + b"1" * 41 + b', "text": "a"}\n',
    "exponent 201": b'{"n": 1e201, "text": "a"}\n',
    "exponent of four digits": b'{"n": 1e0001, "text": "a"}\n',
    "infinite": b'{"n": 1e400, "text": "a"}\n',
    "leading zero": b'{"n": 01, "text": "a"}\n',
    "point without digits": b'{"n": 1., "text": "a"}\n',
    "no digit before the point": b'{"n": .5, "text": "a"}\n',
    "exponent without digits": b'{"n": 1e, "text": "a"}\n',
    "plus sign": b'{"n": +1, "text": "a"}\n',
    "minus alone": b'{"n": -, "text": "a"}\n',
    "NaN": b'{"n": NaN, "text": "a"}\n',
    "Infinity": b'{"n": Infinity, "text": "a"}\n',
    "broken literal": b'{"n": tru, "text": "a"}\n',
    "capital literal": b'{"n": True, "text": "a"}\n',
    "nested 65 deep": b'{"deep": ' + b"[" * 65 + b"]" * 65 + b', "text": "a"}\n',
    "nested objects 65 deep": b'{"d": ' + b'{"a":' * 65 + b"1" + b"}" * 65 + b', "text": "a"}\n',
}


@pytest.mark.parametrize("reason", list(LEFT))
def test_it_leaves_every_unusual_line_to_the_python_path(reason: str) -> None:
    line = LEFT[reason]
    rows = scan(line)
    assert rows and all(kind == 0 and text is None for _, _, kind, text in rows), reason
    both(line, kinds_base.Options())  # and that path gives the line reader's outcome
    both(line, kinds_base.Options(missing_field="error", encoding_errors="replace"))


@pytest.mark.parametrize("limit", [11, 12, 13])
def test_a_line_over_the_limit_is_left_for_its_error(limit: int) -> None:
    line = b'{"text":"a"}'  # 12 bytes without its line feed
    for data in (line, line + b"\n", line + b"\r\n"):
        kinds = [r[2] for r in scan(data, limit=limit)]
        assert kinds == [0 if len(data.rstrip(b"\n")) > limit else 1]
        both(data, kinds_base.Options(max_doc=limit))


def test_a_field_with_a_lone_surrogate_never_matches() -> None:
    line = b'{"\\ud800": "a"}\n'
    key = "\ud800".encode("utf-8", "surrogatepass")
    assert scan(line, key)[0][2] == 0
    both(line, kinds_base.Options(text_field="\ud800"))


def test_rows_cover_the_buffer_and_the_text_buffer_is_reused() -> None:
    lines = [t[0].rstrip(b"\n") for t in TAKEN]
    assert check_taken(b"\n".join([*lines, *(v.rstrip(b"\n") for v in LEFT.values())])) == len(
        TAKEN
    )
    data = b"\n".join([*lines, b'{"id": 1}', b"", b'{"text": 7}'])
    buffer = kinds_jsonl.TextBuffer()
    opts = kinds_base.Options()
    first = [
        bytes(t) for _, t in kinds_jsonl.texts(data, "f", opts, kinds_base.Counters(), into=buffer)
    ]
    kept = buffer.data
    again = [
        bytes(t) for _, t in kinds_jsonl.texts(data, "f", opts, kinds_base.Counters(), into=buffer)
    ]
    assert first == again == [t[1].encode() for t in TAKEN]
    assert buffer.data is kept
    with pytest.raises(ValueError, match="16 bytes longer"):
        _jsonl_kernel.texts(data, 0, len(data), b"text", BIG, bytearray(len(data)))
    with pytest.raises(ValueError, match="inside the buffer"):
        _jsonl_kernel.texts(data, 0, len(data) + 1, b"text", BIG, bytearray(len(data) + 32))


def test_a_forked_worker_writes_its_own_copy_of_the_text_buffer() -> None:
    """`--jobs N` forks its workers after a `--jobs 1` run in the same process may have made
    this thread's buffer: each must write its own copy (an anonymous mapping is shared by
    default, and two workers' texts got mixed)."""
    buffer = kinds_jsonl.TextBuffer()
    opts = kinds_base.Options()
    assert [
        bytes(t)
        for _, t in kinds_jsonl.texts(
            b'{"text": "parent"}', "f", opts, kinds_base.Counters(), into=buffer
        )
    ] == [b"parent"]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        for _ in kinds_jsonl.texts(
            b'{"text": "child!"}', "f", opts, kinds_base.Counters(), into=buffer
        ):
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    assert bytes(buffer.data[:6]) == b"parent"


# Generated lines: the kernel against orjson, jsonl_texts against the line reader ------------------

# Each piece of a line comes valid (what orjson takes) or anything (what it may refuse), so
# that the generated lines reach both paths: about half of them are taken by the kernel.
WS_OK = [b"", b"", b" ", b"\t", b"\r", b"  \t "]
WS_BAD = [b"\x0c", b"\xc2\xa0", b"\x0b"]
ESC_OK = [
    b"\\n",
    b'\\"',
    b"\\\\",
    b"\\/",
    b"\\b",
    b"\\f",
    b"\\r",
    b"\\t",
    b"\\r\\n",
    b"\\u000d",
    b"\\u000a",
    b"\\u000D\\u000A",
    b"\\u00e9",
    b"\\u00E9",
    b"\\u4e2d",
    b"\\ud83d\\ude00",
    b"\\uD83D\\uDE00",
    b"\\udbff\\udfff",
    b"\\u0000",
    b"\\u001f",
    b"\\u007f",
    b"\\u2028",
]
ESC_BAD = [b"\\ud800", b"\\udc00", b"\\ud800\\u0041", b"\\x", b"\\u12", b"\\U00e9", b"\\'"]
RAW_OK = [
    b"\xc3\xa9",
    b"\xe4\xb8\xad",
    b"\xf0\x9f\xa6\x80",
    b"\xef\xbf\xbe",
    b"\xe2\x80\xa8",
    b"\x7f",
    b"\xc2\xa0",
    b"\xf4\x8f\xbf\xbf",
    b"\xe0\xa0\x80",
    b"\xed\x9f\xbf",
]
RAW_BAD = [
    b"\xff",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xe4\xb8",
    b"\xe0\x9f\xbf",
    b"\t",
    b"\r",
    b"\x00",
    b"\x1f",
]
LIT_OK = [b"true", b"false", b"null"]
LIT_BAD = [b"tru", b"nul", b"True", b"NaN", b"-Infinity"]
PLAIN = strategies.text(
    alphabet=strategies.characters(
        min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters='"\\'
    ),
    max_size=20,
).map(str.encode)


def pick(ok: bool, good: list[bytes], bad: list[bytes]) -> strategies.SearchStrategy[bytes]:
    return strategies.sampled_from(good if ok else good + bad)


def string(ok: bool) -> strategies.SearchStrategy[bytes]:
    part = strategies.one_of(PLAIN, PLAIN, pick(ok, ESC_OK, ESC_BAD), pick(ok, RAW_OK, RAW_BAD))
    return strategies.lists(part, max_size=6).map(lambda parts: b'"' + b"".join(parts) + b'"')


def digits(most: int) -> strategies.SearchStrategy[str]:
    return strategies.text(alphabet="0123456789", min_size=1, max_size=most)


def number(ok: bool) -> strategies.SearchStrategy[bytes]:
    """JSON's number grammar within the kernel's bounds (ok), or any digits and signs."""
    if ok:
        integer = strategies.one_of(
            strategies.just("0"),
            strategies.tuples(
                strategies.sampled_from("123456789"),
                digits(39).filter(lambda d: len(d) < 40) | strategies.just(""),
            ).map("".join),
        )
        frac = strategies.one_of(strategies.just(""), digits(40).map(lambda d: "." + d))
        exp = strategies.one_of(
            strategies.just(""),
            strategies.tuples(
                strategies.sampled_from("eE"),
                strategies.sampled_from(["", "+", "-"]),
                strategies.integers(0, 200).map(str),
            ).map("".join),
        )
        return strategies.tuples(strategies.sampled_from(["", "-"]), integer, frac, exp).map(
            lambda t: "".join(t).encode()
        )
    return strategies.one_of(
        strategies.integers(-(2**80), 2**80).map(lambda n: str(n).encode()),
        strategies.floats(allow_nan=True, allow_infinity=True).map(lambda f: repr(f).encode()),
        strategies.tuples(
            strategies.sampled_from(["", "-", "+"]),
            digits(45),
            strategies.one_of(
                strategies.just(""), digits(45).map(lambda d: "." + d), strategies.just(".")
            ),
            strategies.one_of(
                strategies.just(""),
                strategies.tuples(
                    strategies.sampled_from("eE"),
                    strategies.sampled_from(["", "+", "-"]),
                    strategies.text(alphabet="0123456789", max_size=4),
                ).map("".join),
            ),
        ).map(lambda t: "".join(t).encode()),
    )


def key(ok: bool) -> strategies.SearchStrategy[bytes]:
    fixed = [b'"text"', b'"id"', b'"t"', b'"text "', b'"other"', b'"\xc3\xa9"']
    return strategies.one_of(pick(ok, fixed, [b'"te\\u0078t"', b'"\\n"']), string(ok))


def value(ok: bool) -> strategies.SearchStrategy[bytes]:
    ws = pick(ok, WS_OK, WS_BAD)

    def container(inner: strategies.SearchStrategy[bytes]) -> strategies.SearchStrategy[bytes]:
        array = strategies.tuples(strategies.lists(inner, max_size=4), ws).map(
            lambda t: b"[" + t[1] + (b"," + t[1]).join(t[0]) + t[1] + b"]"
        )
        obj = strategies.tuples(
            strategies.lists(strategies.tuples(key(ok), inner), max_size=4), ws
        ).map(
            lambda t: b"{" + (b"," + t[1]).join(k + t[1] + b":" + t[1] + v for k, v in t[0]) + b"}"
        )
        return strategies.one_of(array, obj)

    scalar = strategies.one_of(string(ok), number(ok), pick(ok, LIT_OK, LIT_BAD))
    return strategies.recursive(scalar, container, max_leaves=10)


def deep(ok: bool) -> strategies.SearchStrategy[bytes]:
    return strategies.tuples(
        strategies.integers(58, 64) if ok else strategies.integers(60, 70), value(ok)
    ).map(lambda t: b"[" * t[0] + t[1] + b"]" * t[0])


# Built once: a strategy made inside a draw is built again for every example.
PARTS = {
    ok: {
        "string": string(ok),
        "member": strategies.tuples(
            key(ok), strategies.one_of(string(ok), string(ok), value(ok), deep(ok))
        ),
        "ws": pick(ok, WS_OK, WS_BAD),
        "head": pick(ok, WS_OK, [b"\xef\xbb\xbf", b","]),
        "tail": pick(ok, WS_OK, [b" x", b"\x0c", b"}", b","]),
    }
    for ok in (True, False)
}


@strategies.composite
def record(draw: strategies.DrawFn, ok: bool) -> bytes:
    part = PARTS[ok]
    members = draw(strategies.lists(part["member"], max_size=5))
    if ok:  # the field once, as a string, at the top level
        members = [m for m in members if m[0] != b'"text"']
        members.insert(
            draw(strategies.integers(0, len(members))), (b'"text"', draw(part["string"]))
        )
    elif draw(strategies.booleans()):
        members.insert(
            draw(strategies.integers(0, len(members))), (b'"text"', draw(part["string"]))
        )
    ws = draw(part["ws"])
    body = b"{" + ws + (b"," + ws).join(k + ws + b":" + ws + v for k, v in members) + ws + b"}"
    return draw(part["head"]) + body + draw(part["tail"])


@strategies.composite
def mutated(draw: strategies.DrawFn) -> bytes:
    line = bytearray(draw(record(True)))
    for _ in range(draw(strategies.integers(1, 3))):
        if not line:
            break
        at = draw(strategies.integers(0, len(line) - 1))
        action = draw(strategies.sampled_from(["flip", "drop", "insert", "cut"]))
        if action == "flip":
            line[at] = draw(strategies.integers(0, 255))
        elif action == "drop":
            del line[at]
        elif action == "insert":
            line[at:at] = draw(
                strategies.sampled_from(
                    [b'"', b"\\", b"{", b"}", b"[", b",", b":", b"\n", b"\xff", b"\x00", b" "]
                )
            )
        else:
            del line[at:]
    return bytes(line)


LINE = strategies.one_of(
    record(True),
    record(True),
    record(True),
    record(True),
    record(False),
    mutated(),
    value(False),
    strategies.sampled_from([b"", b"  ", b"\t\r"]),
)
LINES = strategies.tuples(
    strategies.lists(LINE, min_size=1, max_size=8),
    strategies.sampled_from([b"\n", b"\r\n"]),
    strategies.booleans(),
).map(lambda t: t[1].join(t[0]) + (t[1] if t[2] else b""))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=LINES)
def test_every_line_the_kernel_takes_is_orjson_s_with_the_same_text(data: bytes) -> None:
    check_taken(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=LINES,
    missing=strategies.sampled_from(["skip", "error"]),
    encoding=strategies.sampled_from(["error", "replace", "skip-file"]),
    field=strategies.sampled_from(["text", "id", "te\\u0078t"]),
    limit=strategies.sampled_from([BIG, 40]),
    start=strategies.sampled_from([0, 7]),
)
def test_jsonl_texts_gives_what_the_line_reader_gives(
    data: bytes, missing: str, encoding: str, field: str, limit: int, start: int
) -> None:
    """The (line, text) sequence, the counters and the error (code, message, offset) of the
    kernel and its fallback are those of orjson and the standard library, line by line."""
    opts = kinds_base.Options(
        text_field=field, missing_field=missing, encoding_errors=encoding, max_doc=limit
    )
    both(data, opts, line_no=start * 10, offset=start * 100)


# Normalization of UTF-8 texts -----------------------------------------------------------------

CHARS = strategies.one_of(
    strategies.characters(max_codepoint=0x7F),
    strategies.sampled_from(
        "\u00a0\u00e9e\u0301\u0301\u0327\ufb01\u2460\u1100\u1161\u11a8\uac00\u3000\uff21"
        "\u212b\u041a\u00c5\u1e9b\u0323\u4e2d\U0001f980\u2028\ufffe\u0f73\u0344"
    ),
    strategies.characters(blacklist_categories=("Cs",)),
)


@settings(max_examples=600, deadline=None)
@given(
    text=strategies.text(alphabet=CHARS, max_size=200),
    form=strategies.sampled_from(["nfkc", "nfc", "nfkd", "nfd"]),
    gap=strategies.sampled_from([1, 2, 5, pi.NORMALIZE_GAP]),
)
def test_normalize_utf8_is_pi_normalize_encoded(text: str, form: str, gap: int) -> None:
    func = partial(unicodedata.normalize, form.upper())
    data = text.encode()
    got = _jsonl_kernel.normalize_utf8(memoryview(data), gap, func)
    assert bytes(got) == pi.normalize(text, form).encode()
    assert bytes(got) == unicodedata.normalize(form.upper(), text).encode()


def test_normalize_utf8_returns_its_input_when_nothing_changes() -> None:
    func = partial(unicodedata.normalize, "NFKC")
    for data in (b"", b"plain ascii", "café 中文".encode(), bytearray(b"x")):
        assert _jsonl_kernel.normalize_utf8(data, 64, func) is data
    assert _jsonl_kernel.normalize_utf8("a\u00a0b".encode(), 64, func) == b"a b"
    with pytest.raises(ZeroDivisionError):
        _jsonl_kernel.normalize_utf8("\u00e9".encode(), 64, lambda s: 1 / 0)
