"""GGUF: the reader (golden bytes, agreement with gguf's GGUFReader on every real fixture and on
models written by GGUFWriter), the rules (every hostile and broken file a clean finding, no
hang, bounded memory), inspect, and `convert` from GGUF (dequantized or --keep-quantized)."""

from __future__ import annotations

import json
import resource
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from matrixctl.formats import gguf, ztensor
from matrixctl.validate.engine import examine
from tests.helpers import ggufcraft
from tests.helpers.cli import FIXTURES, ROOT, run_cli

GGUF_DIR = FIXTURES / "gguf"
VOCABS = sorted(GGUF_DIR.glob("*.gguf"))


def report_of(tmp_path: Path, data: bytes, scan: bool = True, name: str = "f.gguf"):
    path = tmp_path / name
    path.write_bytes(data)
    return examine(str(path), scan=scan)[0]


def codes_of(report) -> set[str]:
    return {f.code for f in report.findings}


def parse_bytes(data: bytes) -> gguf.GgufFile:
    return gguf.parse(data, len(data))


# Golden bytes, typed from the spec ------------------------------------------------------------

GOLDEN = (
    b"GGUF"  # 0 magic
    + bytes.fromhex("03000000")  # 4 version 3
    + bytes.fromhex("0100000000000000")  # 8 tensor_count 1
    + bytes.fromhex("0300000000000000")  # 16 kv_count 3
    # 24: kv 0, general.architecture = "llama"
    + bytes.fromhex("1400000000000000")  # key length 20
    + b"general.architecture"
    + bytes.fromhex("08000000")  # value type 8: string
    + bytes.fromhex("0500000000000000")  # string length 5
    + b"llama"
    # 69: kv 1, general.alignment = 32 (uint32)
    + bytes.fromhex("1100000000000000")  # key length 17
    + b"general.alignment"
    + bytes.fromhex("04000000")  # value type 4: uint32
    + bytes.fromhex("20000000")  # 32
    # 102: kv 2, tokenizer.ggml.tokens = ["a", "b"]
    + bytes.fromhex("1500000000000000")  # key length 21
    + b"tokenizer.ggml.tokens"
    + bytes.fromhex("09000000")  # value type 9: array
    + bytes.fromhex("08000000")  # item type 8: string
    + bytes.fromhex("0200000000000000")  # 2 items
    + bytes.fromhex("0100000000000000")
    + b"a"
    + bytes.fromhex("0100000000000000")
    + b"b"
    # 165: tensor info "weight", 2 dims [2, 1] (ne0 first), F32, offset 0
    + bytes.fromhex("0600000000000000")
    + b"weight"
    + bytes.fromhex("02000000")  # n_dims 2
    + bytes.fromhex("0200000000000000")  # ne0 = 2
    + bytes.fromhex("0100000000000000")  # ne1 = 1
    + bytes.fromhex("00000000")  # type 0: F32
    + bytes.fromhex("0000000000000000")  # offset 0
    # 211: zero padding to the alignment, 224: data section
    + bytes(13)
    + bytes.fromhex("0000803f00000040")  # 1.0f, 2.0f
    + bytes(24)  # padding after the last tensor, to 256
)


def test_golden_file_typed_from_the_spec(tmp_path: Path) -> None:
    """The hand-typed file parses to exactly its fields, verifies clean, and the gguf package
    reads the same."""
    assert len(GOLDEN) == 256
    gf = parse_bytes(GOLDEN)
    assert (gf.version, gf.tensor_count, gf.kv_count) == (3, 1, 3)
    assert list(gf.kvs) == ["general.architecture", "general.alignment", "tokenizer.ggml.tokens"]
    assert gf.get("general.architecture") == b"llama"
    assert gf.kvs["general.alignment"].vtype == gguf.UINT32 and gf.alignment == 32
    assert gf.get("tokenizer.ggml.tokens").strings(GOLDEN) == [b"a", b"b"]
    assert (gf.info_end, gf.data_offset) == (211, 224)
    (t,) = gf.tensors
    assert (t.name, t.dims, t.shape, t.type_name, t.offset, t.nbytes) == (
        "weight",
        (2, 1),
        (1, 2),
        "F32",
        224,
        8,
    )
    path = tmp_path / "golden.gguf"
    path.write_bytes(GOLDEN)
    report = examine(str(path), scan=True)[0]
    assert report.format == "gguf" and report.findings == []
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    assert r.data_offset == 224
    assert r.tensors[0].data.tolist() == [[1.0, 2.0]]


# Agreement with GGUFReader on every real fixture ----------------------------------------------


def reader_view(path: Path) -> dict:
    """What gguf's GGUFReader sees: every field's type and value, every tensor."""
    from gguf import GGUFReader, GGUFValueType

    r = GGUFReader(str(path))
    fields = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            if f.types[-1] == GGUFValueType.STRING:
                value = [bytes(f.parts[i]) for i in f.data]
            else:
                value = [x for i in f.data for x in f.parts[i].tolist()]
            fields[name] = ([t.name for t in f.types], value)
        elif f.types[0] == GGUFValueType.STRING:
            fields[name] = (["STRING"], bytes(f.parts[-1]))
        else:
            fields[name] = ([f.types[0].name], f.parts[-1].tolist()[0])
    tensors = [
        (t.name, t.tensor_type.name, t.shape.tolist(), t.data_offset, t.n_bytes) for t in r.tensors
    ]
    return {"fields": fields, "tensors": tensors, "alignment": r.alignment}


def ours_view(path: Path) -> dict:
    from matrixctl.io import Source

    with Source.open(str(path)) as src:
        gf = gguf.parse(src.buf, src.size)
        fields = {}
        for kv in gf.kvs.values():
            v = kv.value
            if isinstance(v, gguf.GgufArray):
                types = ["ARRAY", gguf.TYPE_NAMES[v.item_type].upper()]
                values = v.values(src.buf)
                if v.item_type == gguf.BOOL:
                    values = [bool(x) for x in values]
                fields[kv.name] = (types, values)
            elif isinstance(v, bytes):
                fields[kv.name] = (["STRING"], v)
            else:
                fields[kv.name] = (
                    [gguf.TYPE_NAMES[kv.vtype].upper()],
                    bool(v) if kv.vtype == gguf.BOOL else v,
                )
        tensors = [(t.name, t.type_name, list(t.dims), t.offset, t.nbytes) for t in gf.tensors]
        return {"fields": fields, "tensors": tensors, "alignment": gf.alignment}


@pytest.mark.parametrize("path", VOCABS, ids=[p.stem for p in VOCABS])
def test_reader_and_symbol_map_agree_with_gguf_reader(path: Path, tmp_path: Path) -> None:
    """Our reader gives every metadata pair (type and value) and tensor GGUFReader gives, and
    `ingest gguf` gives one symbol per token with id = its GGUF index, in GGUF order. (One test
    per fixture: GGUFReader needs seconds per file, so each is read once per session.)"""
    theirs = reader_view(path)
    assert ours_view(path) == theirs
    tokens = theirs["fields"]["tokenizer.ggml.tokens"][1]
    out = tmp_path / "out"
    assert run_cli("ingest", "gguf", str(path), "-o", str(out)).code == 0
    doc = json.loads((out / "pi_symbol_map.json").read_text("utf-8"))
    by_id = {s["id"]: s["text"] for s in doc["symbols"]}
    assert doc["vocab_size"] == len(tokens)
    assert [s["id"] for s in doc["symbols"]] == sorted(by_id)  # listed in GGUF order
    base = doc["byte_base_id"] if doc["byte_fallback"] else None
    for i, raw in enumerate(tokens):
        if base is not None and base <= i < base + 256:
            assert raw == f"<0x{i - base:02X}>".encode() and i not in by_id
        else:
            assert by_id[i].encode("utf-8") == raw, i


def test_every_real_fixture_verifies_clean() -> None:
    """Decision: a vocabulary-only file may end right after its metadata, without padding to a
    data section it does not have (the fixtures do)."""
    for path in VOCABS:
        report = examine(str(path), scan=True)[0]
        assert report.format == "gguf" and report.findings == [], (path, report.findings)
        gf = gguf.parse(path.read_bytes(), path.stat().st_size)
        assert gf.tensor_count == 0 and gf.data_offset > gf.size


def test_ggml_type_table_matches_the_gguf_package() -> None:
    """Our ggml type table (kept so inspect needs no gguf import) equals gguf's
    GGML_QUANT_SIZES for every type the installed package knows."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    known = 0
    for qtype, (block, size) in GGML_QUANT_SIZES.items():
        ours = gguf.GGML_TYPES.get(int(qtype))
        assert ours is not None, qtype.name
        assert (ours.name, ours.block_size, ours.type_size) == (qtype.name, block, size)
        known += 1
    assert known >= 30
    for t in gguf.GGML_TYPES.values():
        if t.id in {int(q) for q in GGMLQuantizationType}:
            assert GGMLQuantizationType(t.id).name == t.name


# Models written by the gguf package's writer --------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    expected = ggufcraft.write_model(path)
    return path, expected


def test_written_model_agrees_with_gguf_reader(model) -> None:
    path, _ = model
    assert ours_view(path) == reader_view(path)
    report = examine(str(path), scan=True)[0]
    assert report.findings == []


@pytest.mark.parametrize("ext", [".zt", ".safetensors", ".npz"])
def test_convert_dequantizes_every_type(model, tmp_path: Path, ext: str) -> None:
    """Decision: F32, F16 and BF16 keep their dtype (lossless by default); Q8_0, Q4_K, Q6_K
    and Q5_0 become f32 equal to gguf.quants.dequantize (exact: ggml computes in f32 too);
    shapes are outermost first (numpy order, the reverse of GGUF's ne[])."""
    from matrixctl.converters.tensors import open_source

    path, expected = model
    out = tmp_path / f"m{ext}"
    args = ["convert", str(path), str(out)]
    if ext == ".npz":
        args += ["--dtype", "blk.0.attn_v.weight=f32"]  # NumPy has no bf16
    run = run_cli(*args)
    assert run.code == 0, run.stderr
    with open_source(str(out)) as src:
        got = {i.name: (i.dtype, src.array(i).reshape(i.shape)) for i in src.tensors()}
    assert set(got) == set(expected)
    for name, values in expected.items():
        dtype, arr = got[name]
        if name == "blk.0.attn_k.weight":
            assert dtype == "f16"
        elif name == "blk.0.attn_v.weight" and ext != ".npz":
            assert dtype == "bf16"
            import ml_dtypes

            arr = arr.view(ml_dtypes.bfloat16)
        else:
            assert dtype == "f32", name
        assert arr.shape == values.shape, name
        assert np.array_equal(arr.astype(np.float32), values), name


def test_gguf_metadata_travels_as_file_metadata(model, tmp_path: Path) -> None:
    """Decision: convert carries every GGUF metadata pair as file metadata (zTensor root
    attributes, safetensors __metadata__): strings as text, numbers, bools and arrays as their
    JSON text (the vocabulary included); NumPy files drop it with a warning."""
    path, _ = model
    out = tmp_path / "m.safetensors"
    run = run_cli("convert", str(path), str(out))
    assert run.code == 0 and "stored as JSON text" in run.stderr
    header = json.loads(out.read_bytes()[8 : 8 + struct.unpack("<Q", out.read_bytes()[:8])[0]])
    meta = header["__metadata__"]
    assert meta["general.name"] == "tiny" and meta["tokenizer.ggml.model"] == "llama"
    assert json.loads(meta["tokenizer.ggml.tokens"])[:3] == ["<unk>", "<s>", "</s>"]
    assert json.loads(meta["tokenizer.ggml.bos_token_id"]) == 1
    assert json.loads(meta["tokenizer.ggml.add_space_prefix"]) is True
    npz = run_cli("convert", str(path), str(tmp_path / "m.npz"), "--select", "token_embd.weight")
    assert npz.code == 0 and "no place for file metadata" in npz.stderr


def test_keep_quantized_stores_the_raw_blocks(model, tmp_path: Path) -> None:
    """Decision: --keep-quantized writes each quantized tensor as zTensor quantized_group whose
    packed_weight is the GGUF's blocks byte for byte, scales and zeros empty, the ggml type and
    block geometry in its attributes; the zTensor verifier checks them."""
    from gguf import GGUFReader

    path, _ = model
    out = tmp_path / "q.zt"
    assert run_cli("convert", "--keep-quantized", str(path), str(out)).code == 0
    assert examine(str(out), scan=True)[0].findings == []
    parsed = ztensor.parse(out.read_bytes(), out.stat().st_size)
    r = GGUFReader(str(path))
    data = out.read_bytes()
    for t in r.tensors:
        obj = parsed.objects[t.name]
        if t.tensor_type.name in ("F32", "F16", "BF16"):
            assert obj.layout == "dense"
            continue
        assert obj.layout == "quantized_group"
        assert obj.attributes["ggml_type"] == t.tensor_type.name
        assert obj.attributes["quantization"] == "ggml"
        packed = obj.components["packed_weight"]
        assert data[packed.offset : packed.end] == t.data.tobytes()
        assert obj.components["scales"].length == obj.components["zeros"].length == 0
        assert list(obj.shape) == list(reversed(t.shape.tolist()))
    # zTensor to zTensor keeps them; safetensors cannot hold them.
    assert run_cli("convert", str(out), str(tmp_path / "again.zt")).code == 0
    refused = run_cli("convert", "--keep-quantized", str(path), str(tmp_path / "q.safetensors"))
    assert refused.code == 1 and "CONVERT_REFUSED" in refused.stderr and "to .zt" in refused.stderr
    assert not (tmp_path / "q.safetensors").exists()


def test_ztensor_verifier_checks_ggml_blocks(model, tmp_path: Path) -> None:
    """Decision (ztensor.md 20): the zTensor rule for raw ggml blocks: an unknown type, a
    wrong block geometry, rows that are not whole blocks, a packed size other than the blocks'
    (exact, not the generic cap), non-empty scales are all errors."""
    from matrixctl import cbor

    path, _ = model
    good = tmp_path / "q.zt"
    assert (
        run_cli(
            "convert", "--keep-quantized", "--select", "token_embd.weight", str(path), str(good)
        ).code
        == 0
    )
    data = good.read_bytes()
    f = ztensor.parse(data, len(data))

    def rewrite(edit) -> set[str]:
        raw = data[f.manifest_offset : f.manifest_offset + f.manifest_size]
        manifest = cbor.loads(raw)  # a fresh copy to edit
        edit(manifest["objects"]["token_embd.weight"])
        raw = cbor.dumps(manifest)
        blob = data[: f.manifest_offset] + raw + struct.pack("<Q", len(raw)) + ztensor.MAGIC
        return codes_of(report_of(tmp_path, blob, name="bad.zt"))

    assert rewrite(lambda o: None) <= {"ZT_NO_DIGEST"}
    assert "ZT_QUANT_GGML" in rewrite(lambda o: o["attributes"].update(ggml_type="Q9_9"))
    assert "ZT_QUANT_GGML" in rewrite(lambda o: o["attributes"].update(block_size=16))
    assert "ZT_QUANT_GGML" in rewrite(lambda o: o.update(shape=[266 * 16, 16]))
    assert "ZT_LENGTH" in rewrite(lambda o: o.update(shape=[265, 256]))

    def scales(o) -> None:
        o["components"]["scales"]["length"] = 4
        o["components"]["scales"].pop("digest", None)

    assert "ZT_QUANT_GGML" in rewrite(scales)


def test_dequantization_is_chunked_by_whole_blocks(model) -> None:
    """Any run of whole blocks decodes alone: small pieces give the same values as one."""
    from matrixctl.io import Source

    path, expected = model
    with Source.open(str(path)) as src:
        gf = gguf.parse(src.buf, src.size)
        for t in gf.tensors:
            if not t.gtype.quantized:
                continue
            pieces = list(gguf.dequantize_blocks(src.buf, t.offset, t.nbytes, t.gtype, chunk=1000))
            assert len(pieces) > 1 or t.count <= 1000 // 4
            got = np.concatenate(pieces).reshape(t.shape)
            assert np.array_equal(got, expected[t.name]), t.name


def test_convert_select_and_usage(model, tmp_path: Path) -> None:
    path, _ = model
    out = tmp_path / "sel.safetensors"
    run = run_cli("convert", str(path), str(out), "--select", "blk.*", "--json")
    assert run.code == 0 and run.json()["tensors"] == 5 and run.json()["of"] == 7
    bad = run_cli("convert", "--keep-quantized", str(out), str(tmp_path / "x.zt"))
    assert bad.code == 2 and "--keep-quantized does not apply to safetensors" in bad.stderr
    to_gguf = run_cli("convert", str(out), str(tmp_path / "x.gguf"), "--to", "gguf")
    assert to_gguf.code == 0  # GGUF is a destination too (tests/formats/test_gguf_write.py)
    to_gguf = run_cli("convert", str(out), str(tmp_path / "x.gguf"), "--to", "svg")
    assert to_gguf.code == 2 and "CONVERT_UNSUPPORTED" in to_gguf.stderr


def test_a_type_gguf_cannot_dequantize_is_refused_or_kept(tmp_path: Path) -> None:
    """Q8_1 has no dequantizer in the gguf package: convert names the tensor (GGUF_DEQUANT,
    no output); --keep-quantized stores it."""
    from gguf import GGMLQuantizationType, GGUFWriter

    path = tmp_path / "q81.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tensor(
        "x", np.arange(2 * 40, dtype=np.uint8).reshape(2, 40), raw_dtype=GGMLQuantizationType.Q8_1
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert examine(str(path), scan=True)[0].findings == []
    run = run_cli("convert", str(path), str(tmp_path / "o.zt"))
    assert run.code == 1 and "GGUF_DEQUANT" in run.stderr and "--keep-quantized" in run.stderr
    assert not (tmp_path / "o.zt").exists()
    assert run_cli("convert", "--keep-quantized", str(path), str(tmp_path / "o.zt")).code == 0


# inspect --------------------------------------------------------------------------------------


def test_inspect_summarizes_long_arrays_and_lists_tensors(model) -> None:
    path, _ = model
    run = run_cli("inspect", "--json", str(path))
    assert run.code == 0
    doc = run.json()["files"][0]
    assert doc["format"] == "gguf" and doc["version"] == 3 and doc["tensor_count"] == 7
    meta = {m["key"]: m for m in doc["metadata"]}
    tokens = meta["tokenizer.ggml.tokens"]
    assert tokens["type"] == "array[string]" and tokens["count"] == 266
    # The first six real items and the count beside them: no placeholder element.
    assert tokens["value"] == ["<unk>", "<s>", "</s>", "<0x00>", "<0x01>", "<0x02>"]
    assert tokens["shown"] == 6
    assert meta["general.name"]["value"] == "tiny" and meta["general.name"]["count"] is None
    embd = next(t for t in doc["tensors"] if t["name"] == "token_embd.weight")
    assert embd == {
        "name": "token_embd.weight",
        "dtype": "q8_0",
        "shape": [266, 256],
        "offset": embd["offset"],
        "nbytes": 266 * 256 // 32 * 34,
        "extra": {"ggml_type": "Q8_0"},
    }
    assert embd["offset"] % 32 == 0
    assert doc["tokenizer"]["tokens"] == 266 and doc["tokenizer"]["bos_id"] == 1
    full = run_cli("inspect", "--json", "--full", str(path)).json()["files"][0]
    tokens = {m["key"]: m for m in full["metadata"]}["tokenizer.ggml.tokens"]
    assert tokens["count"] == tokens["shown"] == len(tokens["value"]) == 266
    assert tokens["value"][:3] == ["<unk>", "<s>", "</s>"]
    human = run_cli("inspect", str(path))
    assert human.code == 0 and human.stdout == b"" and "token_embd.weight" in human.stderr
    assert "... 260 more" in human.stderr


def test_float32_values_are_shown_as_the_shortest_decimal(tmp_path: Path) -> None:
    """Decision: inspect shows a float32 as the shortest decimal that reads back as the same
    float32 (1e-05, not 9.999999747378752e-06); --json carries the same number."""
    data = ggufcraft.gguf([ggufcraft.kv("a.eps", ggufcraft.F32, struct.pack("<f", 1e-5))])
    path = tmp_path / "f.gguf"
    path.write_bytes(data)
    doc = run_cli("inspect", "--json", str(path)).json()["files"][0]
    assert doc["metadata"][0]["value"] == 1e-05


def test_control_characters_in_keys_and_strings_are_neutralized(tmp_path: Path) -> None:
    evil_key = "a.\x1b[31mred"
    evil = "x\x1b]0;pwned\x07\u202eevil\u0000"
    data = ggufcraft.gguf(
        [
            ggufcraft.kv_str(evil_key, "v"),
            ggufcraft.kv_str("general.name", evil),
            ggufcraft.kv("tokenizer.ggml.tokens", ggufcraft.ARR, ggufcraft.arr_str([evil, "ok"])),
        ],
        [ggufcraft.tensor_info("t\x1b[2J", [2], 0, 0)],
        struct.pack("<2f", 1, 2),
    )
    path = tmp_path / "evil.gguf"
    path.write_bytes(data)
    for args in (["inspect", "--json", str(path)], ["inspect", str(path)], ["verify", str(path)]):
        run = run_cli(*args)
        for stream in (run.stdout.decode("utf-8"), run.stderr):
            assert "\x1b" not in stream and "\u202e" not in stream and "\x07" not in stream
            assert "\x00" not in stream
    doc = run_cli("inspect", "--json", str(path)).json()["files"][0]
    assert doc["name"] == "x\\x1b]0;pwned\\x07\\u202eevil\\x00"
    assert doc["metadata"][0]["key"] == "a.\\x1b[31mred"
    assert "GGUF_KEY" in codes_of(examine(str(path), scan=False)[0])


# Broken and hostile files ---------------------------------------------------------------------


def small_model() -> bytes:
    """A hand-built model: strings, arrays of every kind, two aligned tensors."""
    kvs = [
        ggufcraft.kv_str("general.architecture", "llama"),
        ggufcraft.kv_u32("general.alignment", 32),
        ggufcraft.kv(
            "tokenizer.ggml.tokens", ggufcraft.ARR, ggufcraft.arr_str(["<s>", "a", "b", "ab"])
        ),
        ggufcraft.kv(
            "tokenizer.ggml.scores",
            ggufcraft.ARR,
            ggufcraft.arr_num(ggufcraft.F32, "f", [0, -1, -2, -3]),
        ),
        ggufcraft.kv(
            "tokenizer.ggml.token_type",
            ggufcraft.ARR,
            ggufcraft.arr_num(ggufcraft.I32, "i", [3, 1, 1, 1]),
        ),
        ggufcraft.kv_u32("tokenizer.ggml.bos_token_id", 0),
        ggufcraft.kv_bool("tokenizer.ggml.add_bos_token", 1),
    ]
    infos = [
        ggufcraft.tensor_info("token_embd.weight", [2, 4], 0, 0),
        ggufcraft.tensor_info("b", [3], 1, 32),
    ]
    data = struct.pack("<8f", *range(8)) + bytes(0) + struct.pack("<3e", 1, 2, 3) + bytes(26)
    return ggufcraft.gguf(kvs, infos, data)


def test_the_small_model_is_clean() -> None:
    data = small_model()
    gf = parse_bytes(data)
    assert [t.name for t in gf.tensors] == ["token_embd.weight", "b"]
    assert gf.tensors[1].offset == gf.data_offset + 32


def test_truncation_at_every_length_is_a_clean_finding(tmp_path: Path) -> None:
    """Every prefix of a model that cuts a structure or a tensor is an error finding, never
    an exception. Decision: the padding after the last tensor is optional (the GGUF spec pads
    between tensors; llama.cpp's loader checks each tensor against the file size), so the
    prefixes that only lose that padding are valid."""
    data = small_model()
    gf = parse_bytes(data)
    last_end = max(t.end for t in gf.tensors)
    assert last_end < len(data)
    path = tmp_path / "t.gguf"
    seen: set[str] = set()
    for n in range(len(data)):
        path.write_bytes(data[:n])
        report = examine(str(path), scan=True)[0]
        if n >= last_end:
            assert report.findings == [], n
            continue
        # One root cause, one finding: a cut through the tensor data is one GGUF_TRUNCATED.
        assert [f.severity.value for f in report.findings] == ["error"], n
        seen |= codes_of(report)
    assert {"GGUF_TRUNCATED", "UNKNOWN_FORMAT"} <= seen
    assert seen <= {"GGUF_TRUNCATED", "UNKNOWN_FORMAT", "GGUF_COUNT"}


HUGE = 1 << 63


def hostile_files() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, the code that must be reported)."""
    tok = ggufcraft.kv("tokenizer.ggml.tokens", ggufcraft.ARR, ggufcraft.arr_str(["a", "b"]))
    head = b"GGUF" + struct.pack("<I", 3)
    out = {
        "tensor count 2**63": (ggufcraft.gguf([tok], tensor_count=HUGE), "GGUF_COUNT"),
        "kv count 2**63": (ggufcraft.gguf([tok], kv_count=HUGE), "GGUF_COUNT"),
        "kv count 2**64-1": (head + struct.pack("<QQ", 0, 2**64 - 1), "GGUF_COUNT"),
        "string array of 2**63": (
            ggufcraft.gguf(
                [ggufcraft.kv("x.y", ggufcraft.ARR, struct.pack("<IQ", ggufcraft.STR, HUGE))]
            ),
            "GGUF_COUNT",
        ),
        "u8 array of 2**63": (
            ggufcraft.gguf(
                [ggufcraft.kv("x.y", ggufcraft.ARR, struct.pack("<IQ", ggufcraft.U8, HUGE))]
            ),
            "GGUF_TRUNCATED",
        ),
        "f64 array of 2**61": (
            ggufcraft.gguf(
                [ggufcraft.kv("x.y", ggufcraft.ARR, struct.pack("<IQ", ggufcraft.F64, 1 << 61))]
            ),
            "GGUF_TRUNCATED",
        ),
        "nested array of 2**63": (
            ggufcraft.gguf(
                [ggufcraft.kv("x.y", ggufcraft.ARR, struct.pack("<IQ", ggufcraft.ARR, HUGE))]
            ),
            "GGUF_COUNT",
        ),
        "nested arrays 100 deep": (
            ggufcraft.gguf(
                [ggufcraft.kv("x.y", ggufcraft.ARR, struct.pack("<IQ", ggufcraft.ARR, 1) * 100)]
            ),
            "GGUF_COUNT",
        ),
        "string length past EOF": (
            ggufcraft.gguf([ggufcraft.kv("x.y", ggufcraft.STR, struct.pack("<Q", 10**6))]),
            "GGUF_TRUNCATED",
        ),
        "string length 2**64-1": (
            ggufcraft.gguf([ggufcraft.kv("x.y", ggufcraft.STR, struct.pack("<Q", 2**64 - 1))]),
            "GGUF_TRUNCATED",
        ),
        "key length 2**63": (head + struct.pack("<QQQ", 0, 1, HUGE) + bytes(16), "GGUF_TRUNCATED"),
        "token string past EOF": (
            ggufcraft.gguf(
                [
                    ggufcraft.kv(
                        "tokenizer.ggml.tokens",
                        ggufcraft.ARR,
                        struct.pack("<IQ", ggufcraft.STR, 2)
                        + ggufcraft.s("a")
                        + struct.pack("<Q", 999),
                    )
                ]
            ),
            "GGUF_TRUNCATED",
        ),
        "unknown value type": (
            ggufcraft.gguf([ggufcraft.kv("x.y", 13, b"\x00" * 8)]),
            "GGUF_VALUE_TYPE",
        ),
        "unknown array item type": (
            ggufcraft.gguf([ggufcraft.kv("x.y", ggufcraft.ARR, struct.pack("<IQ", 99, 1))]),
            "GGUF_VALUE_TYPE",
        ),
        "n_dims 2**32-1": (
            ggufcraft.gguf([tok], [ggufcraft.s("t") + struct.pack("<I", 2**32 - 1) + bytes(64)]),
            "GGUF_COUNT",
        ),
        "5 dimensions": (
            ggufcraft.gguf([tok], [ggufcraft.tensor_info("t", [1, 1, 1, 1, 1], 0, 0)], bytes(32)),
            "GGUF_TENSOR_SHAPE",
        ),
        "dimension 2**63": (
            ggufcraft.gguf([tok], [ggufcraft.tensor_info("t", [HUGE, 1], 0, 0)], bytes(32)),
            "GGUF_TENSOR_SHAPE",
        ),
        "2**63 elements": (
            ggufcraft.gguf(
                [tok], [ggufcraft.tensor_info("t", [1 << 32, 1 << 31], 0, 0)], bytes(32)
            ),
            "GGUF_TENSOR_SHAPE",
        ),
        "row not whole blocks": (
            ggufcraft.gguf([tok], [ggufcraft.tensor_info("t", [33], 8, 0)], bytes(64)),
            "GGUF_TENSOR_SHAPE",
        ),
        "unknown ggml type": (
            ggufcraft.gguf([tok], [ggufcraft.tensor_info("t", [4], 4, 0)], bytes(32)),
            "GGUF_TENSOR_TYPE",
        ),
        "tensor offset past EOF": (
            ggufcraft.gguf([tok], [ggufcraft.tensor_info("t", [8], 0, 1 << 40)], bytes(32)),
            "GGUF_TENSOR_BOUNDS",
        ),
        "tensor offset 2**64-32": (
            ggufcraft.gguf([tok], [ggufcraft.tensor_info("t", [8], 0, 2**64 - 32)], bytes(32)),
            "GGUF_TENSOR_BOUNDS",
        ),
        "tensor runs past EOF": (  # a cut file: its one root cause
            ggufcraft.gguf([tok], [ggufcraft.tensor_info("t", [64], 0, 0)], bytes(32)),
            "GGUF_TRUNCATED",
        ),
        "misaligned tensor": (
            ggufcraft.gguf([tok], [ggufcraft.tensor_info("t", [2], 0, 4)], bytes(64)),
            "GGUF_TENSOR_ALIGN",
        ),
        "overlapping tensors": (
            ggufcraft.gguf(
                [tok],
                [ggufcraft.tensor_info("a", [16], 0, 0), ggufcraft.tensor_info("b", [16], 0, 32)],
                bytes(128),
            ),
            "GGUF_TENSOR_OVERLAP",
        ),
        "alignment 0": (
            ggufcraft.gguf([ggufcraft.kv_u32("general.alignment", 0)]),
            "GGUF_ALIGNMENT",
        ),
        "alignment 48": (
            ggufcraft.gguf([ggufcraft.kv_u32("general.alignment", 48)]),
            "GGUF_ALIGNMENT",
        ),
        "alignment as u64": (
            ggufcraft.gguf(
                [ggufcraft.kv("general.alignment", ggufcraft.U64, struct.pack("<Q", 32))]
            ),
            "GGUF_ALIGNMENT",
        ),
        "version 1": (b"GGUF" + struct.pack("<IIi", 1, 0, 0), "GGUF_VERSION"),
        "version 4": (b"GGUF" + struct.pack("<IQQ", 4, 0, 0), "GGUF_VERSION"),
        "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 1) + bytes(40), "GGUF_BYTE_ORDER"),
        "duplicate key": (ggufcraft.gguf([tok, tok]), "GGUF_DUP_KEY"),
        "duplicate tensor": (
            ggufcraft.gguf(
                [tok],
                [ggufcraft.tensor_info("t", [8], 0, 0), ggufcraft.tensor_info("t", [8], 0, 32)],
                bytes(64),
            ),
            "GGUF_TENSOR_NAME",
        ),
        "tensor name of 64 bytes": (
            ggufcraft.gguf([tok], [ggufcraft.tensor_info("n" * 64, [8], 0, 0)], bytes(32)),
            "GGUF_TENSOR_NAME",
        ),
        "bool 2": (ggufcraft.gguf([ggufcraft.kv_bool("x.y", 2)]), "GGUF_BOOL"),
        "bool array with 7": (
            ggufcraft.gguf(
                [
                    ggufcraft.kv(
                        "x.y",
                        ggufcraft.ARR,
                        struct.pack("<IQ", ggufcraft.BOOL, 3) + b"\x01\x00\x07",
                    )
                ]
            ),
            "GGUF_BOOL",
        ),
        "scores of another length": (
            ggufcraft.gguf(
                [
                    tok,
                    ggufcraft.kv(
                        "tokenizer.ggml.scores",
                        ggufcraft.ARR,
                        ggufcraft.arr_num(ggufcraft.F32, "f", [0]),
                    ),
                ]
            ),
            "GGUF_TOKENIZER",
        ),
        "token types as floats": (
            ggufcraft.gguf(
                [
                    tok,
                    ggufcraft.kv(
                        "tokenizer.ggml.token_type",
                        ggufcraft.ARR,
                        ggufcraft.arr_num(ggufcraft.F32, "f", [1, 1]),
                    ),
                ]
            ),
            "GGUF_TOKENIZER",
        ),
        "token type 9": (
            ggufcraft.gguf(
                [
                    tok,
                    ggufcraft.kv(
                        "tokenizer.ggml.token_type",
                        ggufcraft.ARR,
                        ggufcraft.arr_num(ggufcraft.I32, "i", [1, 9]),
                    ),
                ]
            ),
            "GGUF_TOKENIZER",
        ),
        "eos id out of range": (
            ggufcraft.gguf([tok, ggufcraft.kv_u32("tokenizer.ggml.eos_token_id", 2)]),
            "GGUF_TOKENIZER",
        ),
        "tokens not strings": (
            ggufcraft.gguf(
                [
                    ggufcraft.kv(
                        "tokenizer.ggml.tokens",
                        ggufcraft.ARR,
                        ggufcraft.arr_num(ggufcraft.U8, "B", [1]),
                    )
                ]
            ),
            "GGUF_TOKENIZER",
        ),
    }
    return out


@pytest.mark.parametrize("name", list(hostile_files()))
def test_hostile_and_broken_files_are_clean_findings(tmp_path: Path, name: str) -> None:
    """Each is reported with its code, as a finding (no exception), and parsing it allocates
    almost nothing: counts are checked against limits and the bytes left first. Decision:
    what llama.cpp refuses and loses meaning (duplicate keys or tensor names, names of 64
    bytes, more than 4 dimensions, a bool byte other than 0/1, a bad alignment) is an error."""
    data, code = hostile_files()[name]
    tracemalloc.start()
    try:
        report = report_of(tmp_path, data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code in codes_of(report), (name, report.findings)
    assert peak < 8 << 20, (name, peak)
    if code != "GGUF_KEY":
        assert not report.ok(), name


def test_limits_are_refused_before_the_bytes_left(tmp_path: Path, monkeypatch) -> None:
    """Decision: beyond the bytes-left checks, matrixctl reads at most 65,536 metadata pairs,
    262,144 tensors, 16 Mi string items and 65,536 items of arrays of arrays in the whole file,
    nested 8 deep, so that what a file can make the reader allocate stays bounded."""
    head = b"GGUF" + struct.pack("<I", 3)
    pad = bytes(1 << 10)
    cases = {
        "kv_count": head + struct.pack("<QQ", 0, (1 << 16) + 1) + pad,
        "tensor_count": head + struct.pack("<QQ", (1 << 18) + 1, 0) + pad,
        "string items": ggufcraft.gguf(
            [ggufcraft.kv("x.y", ggufcraft.ARR, struct.pack("<IQ", ggufcraft.STR, (1 << 24) + 1))]
        ),
        "nested items": ggufcraft.gguf(
            [ggufcraft.kv("x.y", ggufcraft.ARR, struct.pack("<IQ", ggufcraft.ARR, (1 << 16) + 1))]
        ),
    }
    for what, data in cases.items():
        report = report_of(tmp_path, data)
        assert [f.code for f in report.findings] == ["GGUF_COUNT"], what
        assert "matrixctl reads at most" in report.findings[0].message, what
    # The item budgets hold for all arrays together (scaled down here: 100 strings).
    monkeypatch.setattr(gguf, "MAX_STRING_ITEMS", 100)
    two = ggufcraft.gguf(
        [
            ggufcraft.kv("x.a", ggufcraft.ARR, ggufcraft.arr_str(["s"] * 60)),
            ggufcraft.kv("x.b", ggufcraft.ARR, ggufcraft.arr_str(["s"] * 41)),
        ]
    )
    report = report_of(tmp_path, two)
    assert [f.code for f in report.findings] == ["GGUF_COUNT"] and report.findings[0].field == "x.b"


def test_big_endian_file_is_named_with_a_hint(tmp_path: Path) -> None:
    """Decision: a byte-swapped file is recognised (the version's low 16 bits are zero, as
    llama.cpp tests) and refused with a hint to gguf-convert-endian; it is not read."""
    data = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
    path = tmp_path / "be.gguf"
    path.write_bytes(data)
    run = run_cli("convert", str(path), str(tmp_path / "x.zt"))
    assert run.code == 1 and "GGUF_BYTE_ORDER" in run.stderr and "big-endian" in run.stderr
    assert "gguf-convert-endian" in run.stderr


def test_warnings_layout_trailing_padding_nested_keys(tmp_path: Path) -> None:
    """Decision: a gap or reordering between tensors (llama.cpp refuses it), bytes after the
    last tensor, non-zero padding, arrays of arrays and keys that are not lower_snake_case are
    warnings: the file can still be read exactly."""
    tok = ggufcraft.kv("tokenizer.ggml.tokens", ggufcraft.ARR, ggufcraft.arr_str(["a"]))
    gap = ggufcraft.gguf([tok], [ggufcraft.tensor_info("a", [8], 0, 64)], bytes(96))
    assert codes_of(report_of(tmp_path, gap)) == {"GGUF_LAYOUT"}
    trailing = ggufcraft.gguf(
        [tok], [ggufcraft.tensor_info("a", [8], 0, 0)], bytes(32) + b"junk" * 16
    )
    assert codes_of(report_of(tmp_path, trailing)) == {"GGUF_TRAILING"}
    dirty = bytearray(ggufcraft.gguf([tok], [ggufcraft.tensor_info("a", [7], 0, 0)], bytes(32)))
    dirty[-1] = 0xAA  # padding after the 28-byte tensor
    report = report_of(tmp_path, bytes(dirty))
    assert codes_of(report) == {"GGUF_PADDING"} and report.ok()
    assert codes_of(report_of(tmp_path, bytes(dirty), scan=False)) == set()
    nested = ggufcraft.gguf(
        [
            ggufcraft.kv(
                "x.y",
                ggufcraft.ARR,
                struct.pack("<IQ", ggufcraft.ARR, 1) + ggufcraft.arr_str(["a"]),
            )
        ]
    )
    report = report_of(tmp_path, nested)
    assert codes_of(report) == {"GGUF_NESTED_ARRAY"} and report.ok()
    assert not report.ok(strict=True)
    keys = ggufcraft.gguf(
        [
            ggufcraft.kv_u32("General.Alignment2", 1),
            ggufcraft.kv_u32("", 1),
            ggufcraft.kv_u32("a..b", 1),
        ]
    )
    assert [f.code for f in report_of(tmp_path, keys).findings] == ["GGUF_KEY"] * 3


def test_strings_that_are_not_utf8_are_kept_and_warned(tmp_path: Path) -> None:
    """Decision: the spec says strings are UTF-8; one that is not is a warning and is kept as
    raw bytes (a byte-level vocabulary may hold such tokens)."""
    data = ggufcraft.gguf(
        [
            ggufcraft.kv_str("general.name", b"caf\xe9"),
            ggufcraft.kv(
                "tokenizer.ggml.tokens",
                ggufcraft.ARR,
                ggufcraft.arr_str([b"ok", b"\xff\xfe", b"\x80"]),
            ),
        ]
    )
    report = report_of(tmp_path, data)
    assert [f.code for f in report.findings] == ["GGUF_UTF8", "GGUF_UTF8"]
    assert "2 of 3 strings" in report.findings[1].message and report.ok()
    assert parse_bytes(data).get("tokenizer.ggml.tokens").strings(data)[1] == b"\xff\xfe"


def test_token_embd_rows_must_match_the_vocabulary(tmp_path: Path) -> None:
    tok = ggufcraft.kv("tokenizer.ggml.tokens", ggufcraft.ARR, ggufcraft.arr_str(["a", "b", "c"]))
    data = ggufcraft.gguf(
        [tok], [ggufcraft.tensor_info("token_embd.weight", [4, 2], 0, 0)], bytes(32)
    )
    report = report_of(tmp_path, data)
    assert codes_of(report) == {"GGUF_VOCAB_EMBD"} and report.ok()


def test_hostile_files_never_hang_or_exhaust_memory(tmp_path: Path) -> None:
    """Every hostile file through the real command in a child limited to 1 GiB of address
    space: one finding line each, exit 1, no traceback, within the timeout."""
    paths = []
    for i, (data, _) in enumerate(hostile_files().values()):
        p = tmp_path / f"h{i}.gguf"
        p.write_bytes(data)
        paths.append(str(p))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    proc = subprocess.run(
        [sys.executable, "-m", "matrixctl", "verify", "--json", *paths],
        capture_output=True,
        timeout=120,
        preexec_fn=limit,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert b"Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["files"]) == len(paths) and all(f["findings"] for f in doc["files"])


def test_cli_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "g.gguf"
    good.write_bytes(small_model())
    bad = tmp_path / "b.gguf"
    bad.write_bytes(small_model()[:100])
    assert run_cli("verify", str(good)).code == 0
    assert run_cli("inspect", str(good)).code == 0
    run = run_cli("verify", str(bad))
    assert run.code == 1 and "GGUF_COUNT" in run.stderr and "bytes left" in run.stderr
    assert run_cli("inspect", str(bad)).code == 1
    assert run_cli("verify", str(tmp_path / "missing.gguf")).code == 2
    conv = run_cli("convert", str(bad), str(tmp_path / "o.zt"))
    assert conv.code == 1 and "GGUF_COUNT" in conv.stderr and not (tmp_path / "o.zt").exists()
    stdin = run_cli("verify", "-", stdin=small_model())
    assert stdin.code == 0


def test_inspect_needs_neither_numpy_nor_gguf(tmp_path: Path) -> None:
    """inspect (and the structural checks) of a GGUF import neither numpy nor the gguf
    package: that is what keeps it well under a second on a 262,144-token model."""
    from tests.cli.test_startup import loaded_after

    path = tmp_path / "m.gguf"
    path.write_bytes(small_model())
    assert loaded_after("inspect", "--json", str(path)) == []
