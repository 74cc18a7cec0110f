"""zTensor 2: the conformance set (tests/helpers/zt2craft.py, one file per MUST / MUST NOT
of the spec, listed in docs/formats/ztensor2.md), hostile manifests, the deterministic CBOR
decoder, the writer's canonical bytes, and the CLI."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from matrixctl import cbor
from tests.helpers import zt2craft
from tests.helpers.cli import Run, run_cli


def described(result: Run) -> dict[str, Any]:
    """The document of the one file a `verify/inspect --json` run looked at (the file's own
    object when the document lists files)."""
    doc: dict[str, Any] = result.json()
    if "files" in doc:
        doc = doc["files"][0]
    return doc


def findings(result: Run) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = described(result).get("findings", [])
    return found


@pytest.mark.parametrize("case", zt2craft.CASES, ids=[c.id for c in zt2craft.CASES])
def test_conformance(tmp_path: Path, case: zt2craft.Case) -> None:
    path = tmp_path / f"{case.id}.zt"
    path.write_bytes(case.build())
    inspect = run_cli("inspect", "--json", str(path))
    verify = run_cli("verify", "--json", str(path))
    assert "Traceback" not in verify.stderr + inspect.stderr
    errors = [f["code"] for f in findings(verify) if f["severity"] == "error"]
    if case.code is None:
        assert verify.code == 0, errors
        assert inspect.code == 0
        return
    assert verify.code == 1 and case.code in errors, (case.code, errors)
    hit = next(f for f in findings(verify) if f["code"] == case.code)
    assert hit["offset"] is not None or hit["field"] is not None
    inspect_errors = [f["code"] for f in findings(inspect)]
    # Structural rules run under inspect too; data rules only under verify.
    assert (case.code in inspect_errors) is (not case.scan)
    out = tmp_path / "out.safetensors"
    conv = run_cli("convert", str(path), str(out))
    if not case.scan:
        assert conv.code == 1 and not out.exists()
        assert case.code in conv.stderr or "ZT2_" in conv.stderr


def test_conformance_set_has_one_case_per_code() -> None:
    """Every error code of the format that a reader raises has a must-reject file."""
    from matrixctl import codes
    from matrixctl.formats import ztensor2

    raised = {
        c.code
        for c in codes.CODES.values()
        if c.group == ztensor2.FORMAT and c.severity.value == "error"
    }
    not_files = {"ZT2_WRITE", "ZT2_NOT_READ", "ZT2_UNSUPPORTED"}
    covered = {c.code for c in zt2craft.CASES if c.code}
    assert raised - not_files <= covered, raised - not_files - covered


def test_valid_files_read_back_exact_arrays(tmp_path: Path) -> None:
    from matrixctl.converters.tensors import open_source

    path = tmp_path / "a.zt"
    path.write_bytes(zt2craft.appended())
    with open_source(str(path)) as src:
        infos = {i.name: i for i in src.tensors()}
        assert np.array_equal(src.array(infos["w"]), np.arange(6, dtype="<f4"))
        assert np.array_equal(src.array(infos["z"]), np.array([7, 8], dtype="<f4"))
    path.write_bytes(zt2craft.zstd_file(bytes(range(256)) * 9000, frame=100_000))
    with open_source(str(path)) as src:
        (info,) = src.tensors()
        assert src.array(info).tobytes() == bytes(range(256)) * 9000


def test_appended_file_earlier_generation_checked(tmp_path: Path) -> None:
    """Decision (docs/formats/ztensor2.md, amendments): verify finds an earlier generation by
    its footer magic and a matching manifest hash, and checks it as a file ending there."""
    data = bytearray(zt2craft.appended())
    first = zt2craft.base()
    # Break the first generation's object (a shape whose size disagrees), re-hashing it so its
    # footer still points at a manifest whose hash matches.
    raw = cbor.dumps(
        {"objects": {"w": zt2craft.dense([2, 2], zt2craft.part(zt2craft.F32, zt2craft.A))}}
    )
    moff = struct.unpack("<Q", first[-40:-32])[0]
    old = bytes(first[moff:-40])
    assert len(raw) == len(old)
    data[moff : moff + len(raw)] = raw
    import xxhash

    end = len(first)
    data[end - 24 : end - 16] = struct.pack("<Q", xxhash.xxh3_64_intdigest(raw))
    path = tmp_path / "gen.zt"
    path.write_bytes(bytes(data))
    result = run_cli("verify", "--json", str(path))
    codes_found = [f["code"] for f in findings(result)]
    assert "ZT2_GENERATION" in codes_found and result.code == 0  # a warning: last footer wins


def test_hostile_manifests_stay_bounded(tmp_path: Path) -> None:
    """A part claiming 2^62 bytes, parts escaping the file with a matching hash, nested CBOR
    10,000 deep: one finding each, found without reading or allocating past the file."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for case in ("blob-2-62", "blob-escapes", "cbor-depth-10000", "blob-partial-overlap"):
        build = next(c for c in zt2craft.CASES if c.id == case).build
        path = tmp_path / f"{case}.zt"
        path.write_bytes(build())
        assert run_cli("verify", str(path)).code == 1
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert after - before < 200_000  # KiB: nothing near the declared sizes was allocated


def test_deterministic_cbor_round_trip_and_refusals() -> None:
    value = {"b": [1, -2, 1.5, float("inf"), None, True, "x", b"y"], "a": {"k": 1e300}}
    raw = cbor.dumps(value)
    assert cbor.loads_deterministic(raw) == value
    bad = {
        b"\x19\x00\x01": "deterministic",  # 1 in a 2-byte head
        b"\xfa\x3f\xc0\x00\x00": "deterministic",  # 1.5 as f32
        b"\x5f\x41a\xff": "deterministic",  # indefinite byte string
        b"\xa2\x61b\x00\x61a\x00": "order",
        b"\xa2\x61a\x00\x61a\x00": "duplicate",
        b"\xc0\x00": "tag",
        b"\xf7": "simple",
        b"\x00\x00": "trailing",
    }
    for data, kind in bad.items():
        with pytest.raises(cbor.CborError) as err:
            cbor.loads_deterministic(data)
        assert err.value.kind == kind, data


def test_writer_canonical_bytes_typed_from_the_spec(tmp_path: Path) -> None:
    """Canonical form (spec 6.3) for two tensors, one shared blob: offsets 65536 and the
    manifest at 131072, typed here from the rules, not taken from the writer."""
    from safetensors.numpy import save_file

    a = np.arange(6, dtype="<f4").reshape(2, 3)
    src = tmp_path / "s.safetensors"
    save_file({"b": a, "a": a.copy()}, str(src))
    out = tmp_path / "o.zt"
    assert run_cli("convert", str(src), str(out), "--zt-version", "2").code == 0
    digest = zt2craft.xxh(a.tobytes())
    part = {"dtype": "f32", "blob": [65536, 24], "digest": digest}
    objs = {n: {"shape": [2, 3], "layout": "dense", "parts": {"data": part}} for n in "ab"}
    want = zt2craft.make({65536: a.tobytes()}, {"objects": objs}, manifest_offset=131072)
    assert out.read_bytes() == want


def test_writer_round_trip_every_dtype(tmp_path: Path) -> None:
    from matrixctl.converters.tensors import open_source

    arrays = {
        f"t_{np.dtype(d).name}": (np.arange(12) % 2).astype(d).reshape(3, 4)
        for d in ("<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "i1", "<u8", "<u4", "<u2", "u1", "?")
    }
    arrays["t_c64"] = np.arange(4, dtype="<c8")
    npz = tmp_path / "a.npz"
    np.savez(npz, **arrays)
    for compress in (None, "zstd"):
        out = tmp_path / f"o{compress}.zt"
        args = ["convert", str(npz), str(out), "--zt-version", "2"]
        assert run_cli(*args, *(["--compress", compress] if compress else [])).code == 0
        assert run_cli("verify", str(out)).code == 0
        with open_source(str(out)) as src:
            for info in src.tensors():
                got = src.array(info).view(arrays[info.name].dtype).reshape(info.shape)
                assert np.array_equal(got, arrays[info.name]), info.name


def test_default_version_follows_the_input(tmp_path: Path) -> None:
    """Decision (docs/formats/ztensor2.md, default version): `.zt` output is v1.1 unless the
    input is zTensor 2 or --zt-version 2 is given."""
    v2 = tmp_path / "a.zt"
    v2.write_bytes(zt2craft.base())
    out = tmp_path / "b.zt"
    assert run_cli("convert", str(v2), str(out)).code == 0
    assert out.read_bytes()[:8] == zt2craft.MAGIC
    assert run_cli("convert", str(v2), str(out), "--zt-version", "1").code == 0
    assert out.read_bytes()[:8] == b"ZTEN1000"
    npy = tmp_path / "c.npy"
    np.save(npy, np.zeros(3, dtype="<f4"))
    assert run_cli("convert", str(npy), str(out)).code == 0
    assert out.read_bytes()[:8] == b"ZTEN1000"
    assert run_cli("convert", str(npy), str(out), "--zt-version", "3").code == 2
    assert run_cli("convert", str(npy), str(tmp_path / "x.npz"), "--zt-version", "2").code == 2


def test_inspect_rows_have_the_unified_shape(tmp_path: Path) -> None:
    path = tmp_path / "a.zt"
    path.write_bytes(zt2craft.csr())
    rows = described(run_cli("inspect", "--json", str(path)))["tensors"]
    assert set(rows[0]) == {"name", "dtype", "shape", "offset", "nbytes", "extra"}
    assert rows[0]["offset"] is None and rows[0]["extra"]["layout"] == "zt.sparse_csr/1"
    path.write_bytes(zt2craft.base())
    (row,) = described(run_cli("inspect", "--json", str(path)))["tensors"]
    assert (row["dtype"], row["offset"], row["nbytes"]) == ("f32", 4096, 24)


def test_unknown_layout_is_refused_by_convert_only(tmp_path: Path) -> None:
    path = tmp_path / "a.zt"
    path.write_bytes(next(c for c in zt2craft.CASES if c.id == "valid-unknown-layout").build())
    assert run_cli("verify", str(path)).code == 0
    result = run_cli("convert", str(path), str(tmp_path / "o.safetensors"))
    assert result.code == 1 and "acme.thing/1" in result.stderr
    # zTensor 2 output carries it as it is: same layout, parts and bytes.
    out = tmp_path / "o.zt"
    assert run_cli("convert", str(path), str(out)).code == 0
    assert out.read_bytes() == zt2craft.make(
        {65536: zt2craft.f32(1)},
        {
            "objects": {
                "t": {
                    "shape": [4],
                    "layout": "acme.thing/1",
                    "parts": {"x": zt2craft.part(zt2craft.f32(1), 65536)},
                }
            }
        },
        manifest_offset=131072,
    )


def test_gguf_profile_round_trips_through_zt_v1_and_v2(tmp_path: Path) -> None:
    path = tmp_path / "g.zt"
    path.write_bytes(zt2craft.gguf_q8())
    v1 = tmp_path / "g1.zt"
    back = tmp_path / "g2.zt"
    assert run_cli("convert", str(path), str(v1), "--zt-version", "1").code == 0
    assert run_cli("convert", str(v1), str(back), "--zt-version", "2").code == 0
    doc = described(run_cli("inspect", "--json", str(back)))
    assert doc["tensors"][0]["extra"]["layout"] == "gguf.q8_0/1"
    assert doc["tensors"][0]["extra"]["attributes"] == {"elems_per_block": 32, "block_bytes": 34}


def test_describe_is_json(tmp_path: Path) -> None:
    path = tmp_path / "a.zt"
    path.write_bytes(zt2craft.base(attributes={"b": b"\x01"}))
    result = run_cli("inspect", "--json", str(path))
    assert result.code == 0
    json.loads(result.stdout)


def test_mutated_manifests_with_a_matching_hash_never_crash(tmp_path: Path) -> None:
    """The hash guards the manifest, so plain mutations rarely reach the decoder: here each
    mutated manifest gets its footer hash recomputed, and every command still ends in one
    finding or a clean read (never exit 70, never a traceback)."""
    import random

    import xxhash

    rng = random.Random("zt2-manifest")
    originals = [
        zt2craft.base(attributes={"a": [1, 2.5, "x"]}),
        zt2craft.csr(),
        zt2craft.zstd_file(bytes(3000)),
    ]
    path = tmp_path / "m.zt"
    for original in originals:
        moff, mlen = struct.unpack("<QQ", original[-40:-24])
        for _ in range(40):
            raw = bytearray(original[moff : moff + mlen])
            for _ in range(rng.choice([1, 2, 4])):
                i = rng.randrange(len(raw))
                raw[i] = rng.choice([0, 0xFF, 0x18, 0x9F, 0xBF, 0xC1, rng.randrange(256)])
            footer = struct.pack(
                "<QQQII", moff, len(raw), xxhash.xxh3_64_intdigest(bytes(raw)), 2, 0
            )
            path.write_bytes(original[:moff] + bytes(raw) + footer + zt2craft.MAGIC)
            for args in (["verify", str(path)], ["convert", str(path), str(tmp_path / "o.npz")]):
                result = run_cli(*args)
                assert result.code in (0, 1, 2), (args, result.stderr)
                assert "Traceback" not in result.stderr and "INTERNAL" not in result.stderr


def test_doc_lists_every_conformance_case() -> None:
    from tests.helpers.cli import ROOT

    doc = (ROOT / "docs" / "formats" / "ztensor2.md").read_text()
    missing = [c.id for c in zt2craft.CASES if f"| `{c.id}` |" not in doc]
    assert not missing


def test_nonzero_padding_is_a_warning(tmp_path: Path) -> None:
    """Decision (docs/formats/ztensor2.md, padding): readers MAY ignore padding; verify names
    the first nonzero byte as a warning, wherever the gap is (before the first blob too)."""
    data = bytearray(zt2craft.base())
    data[100] = 0x5A
    path = tmp_path / "p.zt"
    path.write_bytes(bytes(data))
    result = run_cli("verify", "--json", str(path))
    hit = [f for f in findings(result) if f["code"] == "ZT2_PADDING"]
    assert result.code == 0 and hit and hit[0]["offset"] == 100
    assert run_cli("verify", "--strict", str(path)).code == 1


def test_truncation_at_every_length_is_refused(tmp_path: Path) -> None:
    data = zt2craft.base()
    path = tmp_path / "t.zt"
    for n in [*range(0, 60), *range(len(data) - 300, len(data))]:
        path.write_bytes(data[:n])
        result = run_cli("verify", str(path))
        assert result.code == 1, n
        assert "Traceback" not in result.stderr


def test_every_meaningful_byte_flipped_is_found(tmp_path: Path) -> None:
    """A flip in the magic, the blob, the manifest or the footer (all but the reserved field
    and padding) is an error finding: magics, digests over the data, the manifest hash."""
    data = zt2craft.base()
    moff = struct.unpack("<Q", data[-40:-32])[0]
    meaningful = [*range(8), *range(4096, 4096 + 24), *range(moff, len(data))]
    reserved = range(len(data) - 12, len(data) - 8)
    path = tmp_path / "f.zt"
    for i in meaningful:
        if i in reserved:
            continue
        flipped = bytearray(data)
        flipped[i] ^= 0x04
        path.write_bytes(bytes(flipped))
        result = run_cli("verify", str(path))
        assert result.code == 1, i
        assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_round_trip_property(tmp_path: Path) -> None:
    from hypothesis import given, settings, strategies
    from hypothesis.extra.numpy import arrays as np_arrays

    from matrixctl.converters.tensors import open_source
    from matrixctl.formats.ztensor2 import save_file

    dtypes = strategies.sampled_from(
        ["<f4", "<f2", "<f8", "<i8", "<i4", "i1", "u1", "<u2", "?", "<c8"]
    )
    shapes = strategies.lists(strategies.integers(0, 5), min_size=0, max_size=3).map(tuple)
    # Names are Unicode text: no NUL, no lone surrogates (save_file refuses those, see below).
    names = strategies.text(
        strategies.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=8,
    )
    tensors = strategies.dictionaries(
        names, dtypes.flatmap(lambda d: np_arrays(d, shapes)), max_size=4
    )
    counter = iter(range(10**6))

    @settings(max_examples=25, deadline=None)
    @given(tensors, strategies.booleans())
    def check(arrays: dict[str, np.ndarray], zstd: bool) -> None:
        path = tmp_path / f"{next(counter)}.zt"
        save_file(arrays, str(path), compress="zstd" if zstd else None)
        assert run_cli("verify", str(path)).code == 0, path.read_bytes()[-200:]
        with open_source(str(path)) as src:
            got = {i.name: (i, src.array(i)) for i in src.tensors()}
        assert set(got) == set(arrays)
        for name, arr in arrays.items():
            info, flat = got[name]
            assert tuple(info.shape) == arr.shape
            assert flat.tobytes() == np.ascontiguousarray(arr).tobytes()

    check()


def test_save_file_refuses_a_name_that_is_not_utf8_text(tmp_path: Path) -> None:
    """A lone surrogate cannot be stored as a UTF-8 name: one usage error, nothing written
    (found by the round-trip property)."""
    from matrixctl.errors import UsageError
    from matrixctl.formats.ztensor2 import save_file

    out = tmp_path / "bad.zt"
    with pytest.raises(UsageError, match="not valid Unicode"):
        save_file({"ok": np.zeros(2, "<f4"), "\ud800": np.zeros(1, "<f4")}, str(out))
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _parsed(data: bytes) -> tuple[list[Any], list[Any]]:
    from matrixctl.formats import ztensor2

    zt = ztensor2.parse(data, len(data))
    return list(zt.objects.values()), list(zt.problems)


def test_plain_parts_made_at_once_agree_with_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_part` makes a plain part (dtype, blob, digest; every field well-formed) without its
    checks: for every kind of part, the parse must be the one the checks alone give."""
    from matrixctl.formats import ztensor2

    d = zt2craft.F32
    variants: list[dict[str, Any]] = [
        {},
        {"digest": None},  # no digest
        {"digest": 7},  # not text
        {"digest": "xxh3:zz"},  # text, malformed (a later rule's business)
        {"dtype": "f99"},
        {"dtype": 3},
        {"blob": [4096]},
        {"blob": [4096, 24, 1]},
        {"blob": [4096, -1]},
        {"blob": [True, 24]},
        {"blob": (4096, 24)},
        {"type": "bf16"},
        {"type": None},
        {"shard": "s0"},
        {"encoding": "zt.zstd-seekable/1"},
        {"decoded_length": 24},
        {"unknown_key": 1},
    ]
    files = [zt2craft.with_part(**v) for v in variants]
    for role in ("", "a\x00b", "r" * 256, "r" * 1024, "r" * 1025, "\U0001f600" * 256, "é" * 513):
        p = zt2craft.part(d, 4096)
        obj = {"shape": [2, 3], "layout": "dense", "parts": {role: p}}
        files.append(zt2craft.make({4096: d}, {"objects": {"w": obj}}))
    fast = [_parsed(f) for f in files]
    monkeypatch.setattr(ztensor2.manifest, "_PLAIN_KEYS", frozenset())  # every part: the checks
    slow = [_parsed(f) for f in files]
    assert fast == slow
    made = [objs for objs, _ in fast if objs]
    refused = [probs for _, probs in fast if probs]
    assert len(made) >= 8 and len(refused) >= 8  # both sides of the rule were exercised


def test_object_names_at_the_byte_limit() -> None:
    """Names are measured in UTF-8 bytes (spec 3.5, at most 1024): the quick test on the
    length in characters must not let a longer one through, nor refuse one that fits."""
    d = zt2craft.F32
    cases = {
        "n" * 1024: True,
        "n" * 1025: False,
        "\U0001f600" * 256: True,  # 1,024 bytes
        "\U0001f600" * 257: False,
        "é" * 512: True,
        "é" * 513: False,
        "": False,
        "a\x00": False,
    }
    for name, ok in cases.items():
        obj = zt2craft.dense([2, 3], zt2craft.part(d, 4096))
        objs, probs = _parsed(zt2craft.make({4096: d}, {"objects": {name: obj}}))
        assert (len(objs) == 1) is ok, (len(name), probs)
        assert bool(probs) is not ok


def test_overlap_findings_name_both_spans(tmp_path: Path) -> None:
    """Identical references are allowed; a partial overlap is named with both byte ranges
    (the part it meets first in file order, a twin of it named by its own reference), and
    a reference into the manifest names the manifest."""
    from matrixctl.validate.engine import examine

    big = bytes(8192)
    objs = {
        "a": zt2craft.dense([2048], zt2craft.part(big, 4096)),
        "twin": zt2craft.dense([2048], zt2craft.part(big, 4096)),  # identical: allowed
        "b": zt2craft.dense([6], zt2craft.part(bytes(24), 8192)),  # inside a/twin: partial
    }
    path = tmp_path / "o.zt"
    path.write_bytes(zt2craft.make({4096: big}, {"objects": objs}))
    report, _ = examine(str(path), scan=False)
    got = [(f.code, f.message, f.field) for f in report.findings if f.code == "ZT2_OVERLAP"]
    assert got == [
        (
            "ZT2_OVERLAP",
            "b/data (bytes 8,192..8,216) partially overlaps a/data (bytes 4,096..12,288)",
            "b/data",
        )
    ]
    into = zt2craft.make(
        {4096: zt2craft.F32},
        {
            "objects": {
                "w": zt2craft.dense([6], zt2craft.part(zt2craft.F32, 4096)),
                "m": zt2craft.dense([1], {"dtype": "f32", "blob": [8192, 4]}),
            }
        },
    )
    path.write_bytes(into)
    report, _ = examine(str(path), scan=False)
    msgs = [f.message for f in report.findings if f.code == "ZT2_OVERLAP"]
    assert len(msgs) == 1 and "the manifest" in msgs[0] and "m/data" in msgs[0], msgs


@pytest.mark.parametrize(
    ("case", "wanted"),
    [
        # a long name: the quote closed, the length said (the cut repr left it open)
        ("name-long", ["…' (1,026 bytes) is longer than 1024 bytes"]),
        ("attributes-not-map", ["attributes is not a map but an array"]),
        ("shard-bad-name", ["'../etc' is not allowed: a shard name is 1-64 bytes of"]),
    ],
)
def test_manifest_edge_case_messages_say_what_was_found(
    tmp_path: Path, case: str, wanted: list[str]
) -> None:
    from matrixctl.validate.engine import examine
    from tests.helpers import zt2craft

    found = next(c for c in zt2craft.CASES if c.id == case)
    path = tmp_path / "f.zt"
    path.write_bytes(found.build())
    messages = [f.message for f in examine(str(path), scan=True)[0].findings]
    for text in wanted:
        assert any(text in m for m in messages), messages


def test_shown_cuts_long_values_and_keeps_their_quotes() -> None:
    from matrixctl.formats.ztensor2.layout import shown

    assert shown("abc") == "'abc'"
    cut = shown("x" * 500, 40)
    assert cut.startswith("'x") and cut.endswith("…' (500 bytes)") and len(cut) < 60
    assert shown(list(range(100)), 30).endswith("… (100 items)")
