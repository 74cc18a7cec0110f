"""The --json contract (docs/json.md): every command's real documents, on real files of every
format, validated against its schema in docs/schemas/, failures included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import ggufcraft, scx_golden
from tests.helpers.cli import FIXTURES, GOLDEN, ROOT, Run, run_cli

SCHEMAS = ROOT / "docs" / "schemas"


def schema_name(command: str) -> str:
    return command.replace(" ", "-") + ".schema.json"


def json_commands() -> list[str]:
    """Every command that has a --json option, from the command tree docs/cli.md is made of."""
    from matrixctl.cli.docgen import commands

    return [
        " ".join(path[1:])
        for path, cmd in commands()
        if not getattr(cmd, "commands", None)
        and any("--json" in getattr(p, "opts", []) for p in cmd.params)
    ]


def validator(command: str) -> Any:
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    resources = []
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        doc = json.loads(path.read_text())
        resources.append((doc["$id"], Resource.from_contents(doc)))
    registry = Registry().with_resources(resources)
    schema = json.loads((SCHEMAS / schema_name(command)).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry)


def check(command: str, run: Run) -> dict[str, Any]:
    """The run printed exactly one JSON object that its command's schema accepts, with
    schema_version and ok first and ok false exactly when the exit code is not 0."""
    doc = run.json()
    errors = sorted(validator(command).iter_errors(doc), key=str)
    assert not errors, f"{command}: {errors[0].message} at {list(errors[0].absolute_path)}"
    assert list(doc)[:2] == ["schema_version", "ok"]
    assert doc["ok"] is (run.code == 0), (command, run.code, run.stderr)
    no_placeholders(doc)
    return doc


def no_placeholders(value: Any) -> None:
    """A shortened array sits beside `count` and `shown`: exactly `shown` real items, no
    "... (N items)" element anywhere."""
    if isinstance(value, dict):
        if isinstance(value.get("shown"), int):
            arrays = [v for v in value.values() if isinstance(v, list)]
            assert len(arrays) == 1 and len(arrays[0]) == value["shown"]
            assert value["count"] is None or value["shown"] <= value["count"]  # None: unknown
        for item in value.values():
            no_placeholders(item)
    elif isinstance(value, list):
        for item in value:
            assert not (isinstance(item, str) and item.startswith("... (")), item
            no_placeholders(item)


# Real files of every format -----------------------------------------------------------------

ARRAYS = {
    "w": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": np.array([1, -2, 3], dtype=np.int8),
    "c": np.array([7, 8, 9, 10], dtype=np.int32),
}


class Files(dict):
    """Real files by kind; `gguf_values` holds what the GGUF model's tensors hold."""

    gguf_values: dict[str, np.ndarray]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Files:
    d = tmp_path_factory.mktemp("contract")
    out = Files()
    np.save(d / "w.npy", ARRAYS["w"])
    out["npy"] = d / "w.npy"
    np.savez(d / "stored.npz", **ARRAYS)
    out["npz"] = d / "stored.npz"
    np.savez_compressed(d / "deflated.npz", **ARRAYS)
    out["npz-deflate"] = d / "deflated.npz"
    for ext in ("zt", "safetensors", "stb"):
        target = d / f"m.{ext}"
        assert run_cli("convert", str(out["npz"]), str(target)).code == 0
        out[ext] = target
    out["stb-sidecar"] = d / "m.stb.json"
    zst = d / "z.zt"
    assert run_cli("convert", str(out["npz"]), str(zst), "--compress", "zstd").code == 0
    out["zt-zstd"] = zst
    gguf = d / "tiny.gguf"
    out.gguf_values = ggufcraft.write_model(gguf)  # the f32 values of each tensor
    out["gguf"] = gguf
    out["gguf-vocab"] = FIXTURES / "gguf" / "ggml-vocab-bert-bge.gguf"
    from tests.formats.test_hf_model import make_model

    out["hf-model-dir"] = make_model(d / "hf")
    weights = d / "m.weights"
    assert run_cli("convert", str(out["hf-model-dir"]), str(weights)).code == 0
    out["embd"] = weights
    for name in (
        "embd_v1_tiny.weights",
        "matrix_atom_v1.bin",
        "svgt_v1.svgt",
        "token_stream_v1.mxt",
        "ztensor_v1_dense.zt",
        "ztensor_v1_multi.zt",
        "stb_v01_tiny.stb",
        "scx_registry_v1.scxr",
    ):
        out[name] = GOLDEN / name
    out["pi-symbol-map"] = ROOT / "matrixctl" / "data" / "pi_symbol_map.json"
    pack = d / "pack"
    corpus = d / "corpus"
    shutil.copytree(FIXTURES / "corpus", corpus)
    assert run_cli("ingest", "docs", str(corpus), "-o", str(pack)).code == 0
    out["ingest-pack"] = pack
    out["doc-index"] = pack / "doc_index.bin"
    out["junk"] = d / "junk.dat"
    out["junk"].write_bytes(b"not a format at all")
    broken = d / "broken.zt"
    broken.write_bytes(out["zt"].read_bytes()[:-9])
    out["broken"] = broken
    return out


def test_every_command_with_json_has_a_schema() -> None:
    commands = json_commands()
    assert {"inspect", "verify", "convert", "pack atoms", "ingest gguf"} <= set(commands)
    missing = [c for c in commands if not (SCHEMAS / schema_name(c)).is_file()]
    assert not missing, f"no schema in docs/schemas/ for: {missing}"
    for command in commands:
        validator(command)  # a valid draft 2020-12 schema whose references resolve


@pytest.fixture(scope="module")
def inspected(files: dict[str, Path]) -> dict[str, dict[str, Any]]:
    run = run_cli("inspect", "--json", *(str(p) for p in files.values()))
    assert run.code == 1  # the junk and the broken file
    doc = check("inspect", run)
    return dict(zip(files, doc["files"], strict=True))


TENSOR_FORMATS = [
    "npy",
    "npz",
    "npz-deflate",
    "zt",
    "zt-zstd",
    "safetensors",
    "stb",
    "stb-sidecar",
    "gguf",
    "embd",
    "hf-model-dir",
    "embd_v1_tiny.weights",
    "ztensor_v1_multi.zt",
    "stb_v01_tiny.stb",
]


@pytest.mark.parametrize("key", TENSOR_FORMATS)
def test_tensor_rows_are_one_shape_in_every_format(inspected, key: str) -> None:
    rows = inspected[key]["tensors"]
    assert rows
    for row in rows:
        assert list(row) == ["name", "dtype", "shape", "offset", "nbytes", "extra"]


def test_tensor_rows_name_dtypes_one_way_and_give_the_byte_range(inspected, files) -> None:
    """Decision (docs/json.md): dtype is the zTensor short name in every format; offset and
    nbytes are the absolute range of the stored bytes, offset null for a deflated member."""
    by = {key: {r["name"]: r for r in inspected[key]["tensors"]} for key in TENSOR_FORMATS[:7]}
    for key in ("npz", "zt", "safetensors", "npz-deflate", "zt-zstd"):
        assert by[key]["w"]["dtype"] == "f32" and by[key]["b"]["dtype"] == "i8", key
        assert by[key]["w"]["shape"] == [2, 3] and by[key]["c"]["dtype"] == "i32"
    stb = {r["extra"]["tensor_id"]: r for r in inspected["stb"]["tensors"]}
    assert {r["dtype"] for r in stb.values()} == {"f32", "i8", "i32"}
    from tests.formats.test_hf_model import tiny_weights

    for key, want in (
        ("npy", {"w": ARRAYS["w"]}),
        ("npz", ARRAYS),
        ("zt", ARRAYS),
        ("safetensors", ARRAYS),
        ("stb", ARRAYS),
        ("stb-sidecar", ARRAYS),
        ("hf-model-dir", tiny_weights()),
        ("gguf", {k: v for k, v in files.gguf_values.items() if k == "output_norm.weight"}),
    ):
        rows = {r["name"]: r for r in inspected[key]["tensors"]}
        assert set(want) <= set(rows), key
        for name, array in want.items():
            row = rows[name]
            path = files[key]
            if "file" in row["extra"]:  # a folder's shard, a sidecar's .stb file
                path = (path if path.is_dir() else path.parent) / row["extra"]["file"]
            with open(path, "rb") as fp:
                fp.seek(row["offset"])
                assert fp.read(row["nbytes"]) == array.tobytes(), (key, name)
    assert by["npz-deflate"]["w"]["offset"] is None
    assert by["npz-deflate"]["w"]["extra"]["compression"] == "deflate"
    assert by["zt-zstd"]["w"]["extra"]["encoding"] == "zstd"
    gguf = {r["name"]: r for r in inspected["gguf"]["tensors"]}
    assert gguf["token_embd.weight"]["dtype"] == "q8_0"
    assert {r["dtype"] for r in gguf.values()} >= {"f32", "f16", "q8_0"}


def test_inspect_full_lists_every_element(files) -> None:
    short = check("inspect", run_cli("inspect", "--json", str(files["gguf-vocab"])))
    full = check("inspect", run_cli("inspect", "--json", "--full", str(files["gguf-vocab"])))
    rows = {m["key"]: m for m in short["files"][0]["metadata"]}
    tokens = rows["tokenizer.ggml.tokens"]
    assert tokens["shown"] == len(tokens["value"]) < tokens["count"]
    rows = {m["key"]: m for m in full["files"][0]["metadata"]}
    tokens = rows["tokenizer.ggml.tokens"]
    assert tokens["shown"] == len(tokens["value"]) == tokens["count"]
    atoms = check("inspect", run_cli("inspect", "--json", "--full", str(files["pi-symbol-map"])))
    preview = atoms["files"][0]["preview"]
    assert preview["shown"] == preview["count"] == len(preview["items"]) > 12


def test_same_inputs_same_bytes(files) -> None:
    args = ["inspect", "--json", str(files["gguf"]), str(files["zt"]), str(files["ingest-pack"])]
    assert run_cli(*args).stdout == run_cli(*args).stdout


def test_verify_documents(files) -> None:
    run = run_cli("verify", "--json", *(str(p) for p in files.values()))
    doc = check("verify", run)
    assert run.code == 1 and len(doc["files"]) == len(files)
    ok = check("verify", run_cli("verify", "--json", str(files["zt"])))
    assert ok["files"][0]["findings"] == [] and ok["ok"] is True
    missing = check("verify", run_cli("verify", "--json", str(files["zt"]) + ".missing"))
    assert missing["files"][0]["findings"][0]["code"] == "IO_NOT_FOUND"


def test_convert_documents(files, tmp_path: Path) -> None:
    ok = check("convert", run_cli("convert", "--json", str(files["npz"]), str(tmp_path / "o.zt")))
    assert ok["to"] == "ztensor" and ok["tensors"] == 3
    svg = run_cli("convert", "--json", str(files["svgt_v1.svgt"]), str(tmp_path / "o.svg"))
    check("convert", svg)
    u16 = tmp_path / "u16.npz"
    np.savez(u16, h=np.array([1, 2], dtype=np.uint16))
    refused = run_cli("convert", "--json", str(u16), str(tmp_path / "o.stb"))
    doc = check("convert", refused)
    assert refused.code == 1 and doc["error"]["code"] == "CONVERT_REFUSED"
    assert doc["error"]["field"] == "h" and "--dtype" in doc["error"]["hint"]
    assert not (tmp_path / "o.stb").exists()
    broken = run_cli("convert", "--json", str(files["broken"]), str(tmp_path / "b.npz"))
    assert broken.code == 1 and check("convert", broken)["error"]["code"].startswith("ZT_")
    usage = run_cli("convert", "--json", str(files["npz"]), str(tmp_path / "x.zt"), "--per-file")
    assert usage.code == 2 and check("convert", usage)["error"]["code"] == "USAGE"
    bad_value = run_cli("convert", str(files["npz"]), "x.stb", "--per-file", "many", "--json")
    assert bad_value.code == 2 and check("convert", bad_value)["error"]["code"] == "USAGE"
    missing = run_cli("convert", "--json", str(tmp_path / "nope.npz"), str(tmp_path / "y.zt"))
    error = check("convert", missing)["error"]
    assert missing.code == 2 and error["code"] == "IO_NOT_FOUND"
    assert error["path"] == str(tmp_path / "nope.npz")
    # One error line on stderr as well, and one document on stdout.
    assert missing.stderr.count("error[IO_NOT_FOUND]") == 1
    assert missing.out.count('"schema_version"') == 1


def test_pack_and_tokenize_documents(files, tmp_path: Path) -> None:
    atoms = run_cli(
        "pack", "atoms", str(files["token_stream_v1.mxt"]), "-o", str(tmp_path / "a.bin"),
        "--atom-size", "4", "--json",
    )  # fmt: skip
    check("pack atoms", atoms)
    assert atoms.code == 0
    bad = run_cli("pack", "atoms", str(files["junk"]), "-o", str(tmp_path / "b.bin"), "--json")
    assert bad.code != 0 and check("pack atoms", bad)["error"]["code"]
    svgt = run_cli(
        "pack", "svgt", str(tmp_path / "a.bin"), "-o", str(tmp_path / "g.svgt"),
        "--grid", "2x2", "--json",
    )  # fmt: skip
    assert svgt.code == 0, svgt.stderr
    check("pack svgt", svgt)
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello json")
    enc = run_cli("tokenize", "pi", "encode", str(text), "-o", str(tmp_path / "t.mxt"), "--json")
    assert enc.code == 0 and check("tokenize pi encode", enc)
    usage = run_cli("tokenize", "pi", "encode", "--json", "--label")
    assert usage.code == 2 and check("tokenize pi encode", usage)["error"]["code"] == "USAGE"
    # With stdout as the output the ids are in the document (tests/cli/test_ids.py).
    ids = run_cli("tokenize", "pi", "encode", "--json", "-", stdin=b"x")
    assert ids.code == 0 and check("tokenize pi encode", ids)["ids"] == [345]


def test_scx_documents(tmp_path: Path) -> None:
    key = tmp_path / "k"
    keygen = run_cli("tokenize", "scx", "keygen", "-o", str(key), "--json")
    assert keygen.code == 0 and check("tokenize scx keygen", keygen)
    again = run_cli("tokenize", "scx", "keygen", "-o", str(key), "--json")
    assert again.code == 2 and check("tokenize scx keygen", again)["error"]
    src = tmp_path / "src.json"
    src.write_text(json.dumps(scx_golden.SOURCE))
    reg = tmp_path / "reg.scxr"
    sign = run_cli("tokenize", "scx", "sign", str(src), "-o", str(reg), "--key", str(key), "--json")
    assert sign.code == 0 and check("tokenize scx sign", sign)
    pub = str(key) + ".pub"
    blob = tmp_path / "in.bin"
    blob.write_bytes(b"the cat sat")
    enc = run_cli("tokenize", "scx", "encode", str(blob), "-o", str(tmp_path / "t.mxt"),
                  "-r", str(reg), "--trust", pub, "--json")  # fmt: skip
    assert enc.code == 0 and check("tokenize scx encode", enc)
    dec = run_cli("tokenize", "scx", "decode", str(tmp_path / "t.mxt"), "-o",
                  str(tmp_path / "back.bin"), "-r", str(reg), "--trust", pub, "--json")  # fmt: skip
    assert dec.code == 0 and check("tokenize scx decode", dec)
    junk = run_cli("tokenize", "scx", "decode", str(blob), "-o", str(tmp_path / "x.bin"),
                   "-r", str(reg), "--trust", pub, "--json")  # fmt: skip
    assert junk.code != 0 and check("tokenize scx decode", junk)["error"]
    shards = run_cli("pack", "shards", str(blob), "-o", str(tmp_path / "sh"), "-r", str(reg),
                     "--trust", pub, "--created-at", "2024-01-31T12:00:00Z", "--json")  # fmt: skip
    assert shards.code == 0 and check("pack shards", shards)


def test_ingest_documents(files, tmp_path: Path) -> None:
    corpus = FIXTURES / "corpus"
    docs = run_cli("ingest", "docs", str(corpus), "-o", str(tmp_path / "p"), "--json")
    assert docs.code == 0 and check("ingest docs", docs)
    parts = []
    for i in range(2):
        part = tmp_path / f"s{i}"
        run = run_cli("ingest", "docs", str(corpus), "-o", str(part), "--shard", f"{i}/2")
        assert run.code == 0
        parts.append(str(part))
    merge = run_cli("ingest", "merge", *parts, "-o", str(tmp_path / "m"), "--json")
    assert merge.code == 0 and check("ingest merge", merge)
    lonely = run_cli("ingest", "merge", parts[0], "-o", str(tmp_path / "m2"), "--json")
    assert lonely.code == 1 and check("ingest merge", lonely)["error"]["code"] == "INGEST_MERGE"
    gguf = run_cli("ingest", "gguf", str(files["gguf"]), "-o", str(tmp_path / "g"), "--json")
    assert gguf.code == 0 and check("ingest gguf", gguf)
    junk = run_cli("ingest", "gguf", str(files["junk"]), "-o", str(tmp_path / "g2"), "--json")
    assert junk.code != 0 and check("ingest gguf", junk)["error"]
    missing = run_cli("ingest", "docs", str(tmp_path / "none"), "-o", str(tmp_path / "q"), "--json")
    assert missing.code == 2 and check("ingest docs", missing)["error"]["code"] == "IO_NOT_FOUND"


def test_internal_errors_are_documents_too(files, monkeypatch) -> None:
    from matrixctl.validate import engine

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "examine", boom)
    run = run_cli("inspect", "--json", str(files["zt"]))
    assert run.code == 70 and check("inspect", run)["error"]["code"] == "INTERNAL"
    human = run_cli("inspect", str(files["zt"]))
    assert human.code == 70 and human.stdout == b""

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "examine", interrupted)
    run = run_cli("verify", "--json", str(files["zt"]))
    assert run.code == 130 and check("verify", run)["error"]["code"] == "INTERRUPTED"
    assert "interrupted" in run.stderr


def test_invalid_inputs_give_one_document_not_two(files) -> None:
    """verify and inspect report an unreadable or invalid file in their own document; main()
    adds no failure document after it."""
    for command in ("verify", "inspect"):
        run = run_cli(command, "--json", str(files["junk"]), str(files["zt"]) + ".missing")
        assert run.code == 2 and run.out.count('"schema_version"') == 1
        doc = check(command, run)
        assert [f["findings"][0]["code"] for f in doc["files"]] == [
            "UNKNOWN_FORMAT",
            "IO_NOT_FOUND",
        ]


OLD_SHAPES = [
    # inspect of one path used to be the file's object itself, of several a bare array
    ("inspect", {"path": "a.zt", "format": "ztensor", "findings": [], "checks": []}),
    ("inspect", [{"path": "a.zt", "format": "ztensor", "findings": []}]),
    # tensor rows differed by format
    (
        "inspect",
        {
            "schema_version": 1,
            "ok": True,
            "files": [
                {
                    "path": "a.gguf",
                    "format": "gguf",
                    "findings": [],
                    "checks": [],
                    "skipped": [],
                    "tensors": [
                        {"name": "t", "type": "Q8_0", "shape": [2], "offset": 0, "bytes": 34}
                    ],
                }
            ],
        },
    ),
    # no schema_version
    ("verify", {"ok": True, "strict": False, "files": []}),
    # a failure used to print nothing; a document without its error is refused
    ("convert", {"schema_version": 1, "ok": False}),
]


@pytest.mark.parametrize(("command", "doc"), OLD_SHAPES)
def test_schemas_refuse_the_old_shapes(command: str, doc: Any) -> None:
    assert list(validator(command).iter_errors(doc))


@pytest.mark.parametrize(
    ("spelling", "label"),
    [
        ("f32", "f32"),
        ("F32", "f32"),  # safetensors, ggml
        ("float32", "f32"),  # numpy, STB's spec
        ("BF16", "bf16"),
        ("F8_E4M3", "f8_e4m3"),
        ("int8", "i8"),
        ("U16", "u16"),
        ("Q4_K", "q4_k"),  # quantized ggml types keep their name, lower-case
        ("IQ2_XS", "iq2_xs"),
        (None, "unknown"),
    ],
)
def test_one_dtype_naming(spelling: str | None, label: str) -> None:
    """Decision (docs/json.md, "Tensor rows"): one dtype spelling in every format's rows."""
    from matrixctl.tensors import dtype_label

    assert dtype_label(spelling) == label
