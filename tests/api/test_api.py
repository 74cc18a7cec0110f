"""The public Python API (docs/api.md): open/load/save/convert, verify/inspect against the CLI,
tokenizers, pack datasets (a training loop that checkpoints and resumes), errors and codes."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import matrixctl
from matrixctl.errors import FormatError, InputError, MatrixError, UsageError
from tests.helpers import scx_golden
from tests.helpers.cli import FIXTURES, ROOT, run_cli

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
B = np.array([1, -2, 3], dtype=np.int32)


def _tensors() -> dict[str, np.ndarray]:
    return {"encoder.weight": W, "encoder.bias": B}


# Import cost ------------------------------------------------------------------------------------


def test_import_matrixctl_loads_neither_numpy_nor_the_api() -> None:
    probe = (
        "import sys, matrixctl\n"
        "names = [m for m in sys.modules if m == 'numpy' or m.startswith('matrixctl')]\n"
        "print(','.join(sorted(names)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout.strip()
    assert out == "matrixctl"


def test_api_names_resolve_lazily_and_unknown_names_raise() -> None:
    assert matrixctl.open is matrixctl.api.open
    assert matrixctl.convert is matrixctl.api.convert
    with pytest.raises(AttributeError):
        matrixctl.no_such_name  # noqa: B018


def test_convert_is_the_api_function_also_after_the_converters_are_imported() -> None:
    """Decision: the converter registry is the subpackage `matrixctl.converters`, so the name
    `matrixctl.convert` belongs to the API function alone: importing the registry (as the CLI
    does) leaves it the function, and the registry is a plain module, not callable."""
    import importlib
    import types

    converters = importlib.import_module("matrixctl.converters")
    assert isinstance(matrixctl.convert, types.FunctionType)
    assert matrixctl.convert is matrixctl.api.convert
    assert type(converters) is types.ModuleType and not callable(converters)


# Tensor containers ------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["zt", "safetensors", "npz", "stb"])
def test_save_then_open_gives_names_shapes_values_and_metadata(tmp_path: Path, ext: str) -> None:
    path = tmp_path / f"m.{ext}"
    summary = matrixctl.save(path, _tensors(), metadata={"model": "tiny"})
    assert summary["tensors"] == 2
    with matrixctl.open(path) as f:
        assert sorted(f) == sorted(_tensors()) and len(f) == 2 and "encoder.bias" in f
        np.testing.assert_array_equal(f["encoder.weight"], W)
        np.testing.assert_array_equal(f.get("encoder.bias"), B)
        assert f["encoder.weight"].dtype == np.float32 and f["encoder.weight"].shape == (3, 4)
        assert f.infos["encoder.weight"].dtype == "f32"
        assert f.get("missing") is None
        if ext != "npz":
            assert f.metadata == {"model": "tiny"}


def test_raw_tensors_are_zero_copy_views_and_compressed_ones_are_decoded(tmp_path: Path) -> None:
    """Decision (docs/api.md): raw little-endian data is a read-only view of the mapped file;
    compressed data is decoded into an array of its own."""
    matrixctl.save(tmp_path / "raw.safetensors", _tensors())
    matrixctl.save(tmp_path / "z.zt", _tensors(), compress="zstd")
    with matrixctl.open(tmp_path / "raw.safetensors") as f:
        arr = f["encoder.weight"]
        assert not arr.flags.writeable and not arr.flags.owndata
        data = (tmp_path / "raw.safetensors").read_bytes()
        assert W.tobytes() in data  # the view's bytes are the file's
    with matrixctl.open(tmp_path / "z.zt") as f:
        np.testing.assert_array_equal(f["encoder.weight"], W)


def test_load_copies_every_tensor_so_they_outlive_the_file(tmp_path: Path) -> None:
    matrixctl.save(tmp_path / "m.zt", _tensors())
    got = matrixctl.load(tmp_path / "m.zt")
    assert list(got) == ["encoder.weight", "encoder.bias"]  # storage order
    assert got["encoder.weight"].flags.owndata and got["encoder.weight"].flags.writeable
    np.testing.assert_array_equal(got["encoder.bias"], B)


def test_bf16_big_endian_and_bool_round_trip(tmp_path: Path) -> None:
    tensors = {
        "h": np.array([0.5, -2.0, 3.0], dtype=ml_dtypes.bfloat16),
        "be": np.array([1.5, 2.25], dtype=">f8"),
        "mask": np.array([True, False, True]),
    }
    matrixctl.save(tmp_path / "m.safetensors", tensors)
    got = matrixctl.load(tmp_path / "m.safetensors")
    assert got["h"].dtype == ml_dtypes.bfloat16 and got["h"].tolist() == [0.5, -2.0, 3.0]
    assert got["be"].dtype == np.dtype("<f8") and got["be"].tolist() == [1.5, 2.25]
    assert got["mask"].tolist() == [True, False, True]


def test_save_is_deterministic_and_matches_cli_convert_bytes(tmp_path: Path) -> None:
    matrixctl.save(tmp_path / "a.zt", _tensors())
    matrixctl.save(tmp_path / "b.zt", _tensors())
    assert (tmp_path / "a.zt").read_bytes() == (tmp_path / "b.zt").read_bytes()
    res = run_cli("convert", str(tmp_path / "a.zt"), str(tmp_path / "cli.safetensors"))
    assert res.code == 0, res.stderr
    summary = matrixctl.convert(tmp_path / "a.zt", tmp_path / "api.safetensors")
    assert summary["from"] == "ztensor" and summary["to"] == "safetensors"
    cli_bytes = (tmp_path / "cli.safetensors").read_bytes()
    assert (tmp_path / "api.safetensors").read_bytes() == cli_bytes
    assert (
        matrixctl.convert(tmp_path / "a.zt", tmp_path / "c.zt", select=["*.bias"])["tensors"] == 1
    )


def test_save_refusals_leave_no_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        matrixctl.save(tmp_path / "o.zt", {"s": np.array(["text"])})
    with pytest.raises(FormatError) as err:
        matrixctl.save(tmp_path / "o.npy", _tensors())  # .npy holds one tensor
    assert err.value.code == "CONVERT_REFUSED"
    with pytest.raises(UsageError):
        matrixctl.save(tmp_path / "o.unknown", _tensors())
    assert list(tmp_path.iterdir()) == []


def test_convert_refuses_unknown_and_misapplied_options(tmp_path: Path) -> None:
    matrixctl.save(tmp_path / "a.zt", _tensors())
    with pytest.raises(TypeError, match="colour"):
        matrixctl.convert(tmp_path / "a.zt", tmp_path / "b.zt", colour="red")  # type: ignore[call-arg]
    with pytest.raises(UsageError, match="--per-file"):
        matrixctl.convert(tmp_path / "a.zt", tmp_path / "b.zt", per_file=2)
    assert not (tmp_path / "b.zt").exists()


def _cli_code(path: Path) -> str:
    res = run_cli("verify", "--json", str(path))
    return str(res.json()["files"][0]["findings"][0]["code"])


def test_open_errors_carry_the_codes_the_cli_reports(tmp_path: Path) -> None:
    missing = tmp_path / "nope.zt"
    with pytest.raises(InputError) as err:
        matrixctl.open(missing)
    assert err.value.code == _cli_code(missing) == "IO_NOT_FOUND"
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00not a tensor file at all")
    with pytest.raises(FormatError) as err2:
        matrixctl.open(junk)
    assert err2.value.code == _cli_code(junk) == "UNKNOWN_FORMAT"
    matrixctl.save(tmp_path / "m.safetensors", _tensors())
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes((tmp_path / "m.safetensors").read_bytes()[:-5])
    with pytest.raises(FormatError) as err3:
        matrixctl.load(cut)
    assert err3.value.code == _cli_code(cut)


def test_a_closed_file_refuses_reads(tmp_path: Path) -> None:
    matrixctl.save(tmp_path / "m.zt", _tensors())
    f = matrixctl.open(tmp_path / "m.zt")
    f.close()
    with pytest.raises(UsageError):
        f["encoder.bias"]


# verify and inspect -----------------------------------------------------------------------------


def test_inspect_is_exactly_the_cli_json_document(tmp_path: Path) -> None:
    matrixctl.save(tmp_path / "m.zt", _tensors())
    for path in (
        tmp_path / "m.zt",
        tmp_path / "missing.bin",
        FIXTURES / "gguf" / "ggml-vocab-gpt-2.gguf",
    ):
        res = run_cli("inspect", "--json", str(path))
        assert matrixctl.inspect(path) == res.json()
    res = run_cli("inspect", "--json", "--stats", str(tmp_path / "m.zt"))
    doc = matrixctl.inspect(tmp_path / "m.zt", stats=True)
    assert doc == res.json() and doc["files"][0]["tensors"][0]["stats"] is not None
    assert list(doc)[:2] == ["schema_version", "ok"]


def test_inspect_id_previews_match_the_cli(pack: Path) -> None:
    atoms = pack / "matrix_atoms.bin"
    smap = pack / "pi_symbol_map.json"
    assert matrixctl.inspect(atoms) == run_cli("inspect", "--json", str(atoms)).json()
    cli = run_cli("inspect", "--json", "--ids", "5:4", "-s", str(smap), str(atoms)).json()
    assert matrixctl.inspect(atoms, ids="5:4", symbols=smap) == cli
    with pytest.raises(UsageError):
        matrixctl.inspect(atoms, ids="x:y")


def test_inspect_and_verify_of_a_pack_folder_match_the_cli(pack: Path) -> None:
    assert matrixctl.inspect(pack) == run_cli("inspect", "--json", str(pack)).json()
    cli = run_cli("verify", "--json", str(pack)).json()["files"][0]
    assert matrixctl.verify(pack).to_json() == cli and cli["ok"]


def test_verify_gives_the_cli_findings_and_codes(tmp_path: Path) -> None:
    matrixctl.save(tmp_path / "m.zt", _tensors())
    good = matrixctl.verify(tmp_path / "m.zt")
    assert good.ok() and good.findings == [] and isinstance(good, matrixctl.Report)
    bad = tmp_path / "bad.zt"
    data = bytearray((tmp_path / "m.zt").read_bytes())
    data[70] ^= 0xFF
    bad.write_bytes(bytes(data))
    report = matrixctl.verify(bad)
    cli = run_cli("verify", "--json", str(bad)).json()["files"][0]
    assert report.to_json() == cli and not report.ok()
    assert matrixctl.verify(tmp_path / "missing").exit_code() == 2


# Tokenizers -------------------------------------------------------------------------------------


def test_pi_tokenizer_round_trips_and_batches() -> None:
    tok = matrixctl.load_tokenizer()
    texts = ["hello world", "Packing tokens into atoms", ""]
    batch = tok.encode_batch(texts)
    assert [tok.decode(ids) for ids in batch] == texts
    assert tok.kind == "pi" and tok.vocab_size and all(int(i) < tok.vocab_size for i in batch[0])
    np.testing.assert_array_equal(batch[1], tok.encode(texts[1]))
    with pytest.raises(UsageError):
        tok.encode(b"bytes")


def test_pi_tokenizer_decodes_the_documents_of_a_pack(pack: Path) -> None:
    """A pack built by the CLI with the default map: every JSON Lines record of the corpus is
    one document, and decoding its ids (without the end-of-document id) gives its text."""
    ds = matrixctl.open_pack(pack)
    tok = matrixctl.load_tokenizer()
    decoded = {tok.decode(ds.document(j)[:-1]) for j in range(ds.documents)}
    lines = (FIXTURES / "corpus" / "records.jsonl").read_text("utf-8").splitlines()
    texts = {json.loads(line).get("text") for line in lines if line.strip()} - {None}
    assert texts and texts <= decoded


def test_scx_tokenizer_encodes_like_the_cli(tmp_path: Path) -> None:
    keys = tmp_path / "pi.key"
    assert run_cli("tokenize", "scx", "keygen", "-o", str(keys)).code == 0
    src = tmp_path / "src.json"
    src.write_text(json.dumps(scx_golden.SOURCE))
    reg = tmp_path / "reg.scxr"
    assert (
        run_cli("tokenize", "scx", "sign", str(src), "-o", str(reg), "--key", str(keys)).code == 0
    )
    pub = str(keys) + ".pub"
    tok = matrixctl.load_tokenizer(reg, trust=[pub])
    data = b"hello scx world\n" * 3
    cli = run_cli("tokenize", "scx", "encode", "-r", str(reg), "--trust", pub, stdin=data)
    assert cli.code == 0, cli.stderr
    ids = tok.encode(data)
    assert ids.dtype == np.uint16 and ids.size > 3
    assert ids.astype("<u2").tobytes() in cli.stdout  # the CLI's token stream holds these ids
    assert tok.decode(ids) == data.decode() and tok.decode_bytes(ids) == data
    with pytest.raises(MatrixError) as err:
        matrixctl.load_tokenizer(reg, trust=[])
    assert err.value.code == "UNSIGNED_REGISTRY"


def test_load_tokenizer_refuses_other_formats(tmp_path: Path) -> None:
    matrixctl.save(tmp_path / "m.zt", _tensors())
    with pytest.raises(FormatError) as err:
        matrixctl.load_tokenizer(tmp_path / "m.zt")
    assert err.value.code == "UNKNOWN_FORMAT"


# Pack datasets ----------------------------------------------------------------------------------


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    out = tmp_path / "pack"
    res = run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", str(out), "--atom-size", "16")
    assert res.code == 0, res.stderr
    return out


def _raw_atoms(pack: Path) -> np.ndarray:
    """The payload read without matrixctl: the 64-byte header's counts, then uint16/32 ids."""
    data = (pack / "matrix_atoms.bin").read_bytes()
    dtype = {1: "<u2", 2: "<u4"}[data[0x0C]]
    atom_size = int.from_bytes(data[0x14:0x18], "little")
    return np.frombuffer(data[64:], dtype=dtype).reshape(-1, atom_size)


def test_pack_len_items_and_documents(pack: Path) -> None:
    ds = matrixctl.open_pack(pack)
    raw = _raw_atoms(pack)
    assert len(ds) == raw.shape[0] and ds.atom_size == raw.shape[1]
    for i in (0, 5, len(ds) - 1, -1):
        np.testing.assert_array_equal(ds[i], raw[i])
    row = ds[3]
    assert not row.flags.writeable and not row.flags.owndata  # a view of the mapping
    base = row
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)  # the mapped payload
    with pytest.raises(IndexError):
        ds[len(ds)]
    manifest = json.loads((pack / "ingest_manifest.json").read_text())
    docs = [ds.document(j) for j in range(ds.documents)]
    assert ds.documents == manifest["documents"]
    assert all(int(d[-1]) == manifest["eos_id"] for d in docs)
    joined = np.concatenate(docs)
    np.testing.assert_array_equal(joined, raw.reshape(-1)[: manifest["tokens"]])


def test_pack_is_a_map_style_dataset_without_torch(pack: Path) -> None:
    ds = matrixctl.open_pack(pack)
    assert hasattr(type(ds), "__len__") and hasattr(type(ds), "__getitem__")
    assert [ds[i].tolist() for i in range(len(ds))] == _raw_atoms(pack).tolist()
    # In a fresh interpreter: other test modules import torch (the ztensor peer does when it
    # is installed, and the test extra installs it).
    code = (
        "import sys, matrixctl\n"
        "ds = matrixctl.open_pack(sys.argv[1])\n"
        "ds[0], ds[0:2], ds.__getitems__([1]), list(ds.iter())\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(pack)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_training_loop_checkpoints_mid_epoch_and_resumes_the_same_order(pack: Path) -> None:
    ds = matrixctl.open_pack(pack)
    raw = _raw_atoms(pack)
    everything = [a.tolist() for a in ds.iter(seed=7)]  # epoch 0, uninterrupted
    assert sorted(everything) == sorted(raw.tolist())  # a permutation of every atom
    assert everything != raw.tolist()  # shuffled
    assert [a.tolist() for a in ds.iter(seed=7)] == everything  # a pure function of its args
    after = [a.tolist() for a in ds.iter(start=ds.state_dict())]  # epoch 1: another order
    assert after != everything and sorted(after) == sorted(everything)
    assert [a.tolist() for a in ds.iter(seed=7, epoch=1)] == after

    run = matrixctl.open_pack(pack)
    seen = []
    for atom in run.iter(seed=7):
        seen.append(atom.tolist())
        if len(seen) == 11:
            checkpoint = json.dumps(run.state_dict())  # saved beside the model
            break
    assert json.loads(checkpoint) == {"epoch": 0, "position": 11, "seed": 7, "shuffle": True}
    resumed = matrixctl.open_pack(pack)  # a new process after the crash
    resumed.load_state_dict(json.loads(checkpoint))
    seen += [a.tolist() for a in resumed.iter()]
    assert seen == everything
    assert resumed.state_dict() == {"epoch": 1, "position": 0, "seed": 7, "shuffle": True}
    assert [a.tolist() for a in resumed.iter(start=resumed.state_dict())] == after
    assert [a.tolist() for a in resumed.iter(seed=7)] == everything  # the loaded state: once
    other = matrixctl.open_pack(pack)
    assert [a.tolist() for a in other.iter(start=json.loads(checkpoint))] == everything[11:]
    plain = [
        a.tolist()
        for a in other.iter(
            seed=7, shuffle=False, start={"epoch": 0, "position": 0, "seed": 7, "shuffle": False}
        )
    ]
    assert plain == raw.tolist()


def test_pack_state_errors_have_a_code(pack: Path) -> None:
    ds = matrixctl.open_pack(pack)
    bad = [
        {"epoch": 0, "position": len(ds) + 1, "seed": 0, "shuffle": True},
        {"epoch": -1, "position": 0, "seed": 0, "shuffle": True},
        {"epoch": 0, "position": 0, "seed": 0},
        "not a dict",
    ]
    for state in bad:
        with pytest.raises(FormatError) as err:
            ds.load_state_dict(state)  # type: ignore[arg-type]
        assert err.value.code == "PACK_STATE"
    ds.load_state_dict({"epoch": 0, "position": 3, "seed": 1, "shuffle": True})
    with pytest.raises(FormatError, match="same order"):
        ds.iter(seed=2)


def test_open_pack_checks_cheaply_and_verify_checks_everything(pack: Path, tmp_path: Path) -> None:
    atoms = pack / "matrix_atoms.bin"
    data = bytearray(atoms.read_bytes())
    data[-1] ^= 0x01  # one payload bit: only the hash and payload CRC can tell
    atoms.write_bytes(bytes(data))
    matrixctl.open_pack(pack)  # cheap checks pass
    with pytest.raises(FormatError) as err:
        matrixctl.open_pack(pack, verify=True)
    cli = run_cli("verify", "--json", str(pack)).json()["files"][0]["findings"]
    assert err.value.code == cli[0]["code"] == "PACK_HASH"
    atoms.write_bytes(bytes(data[:-32]))  # cut: the manifest's size no longer matches
    with pytest.raises(FormatError) as err2:
        matrixctl.open_pack(pack)
    assert (
        err2.value.code
        == run_cli("verify", "--json", str(pack)).json()["files"][0]["findings"][0]["code"]
    )


def test_open_pack_refuses_what_is_not_a_pack(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        matrixctl.open_pack(tmp_path / "nope")
    assert err.value.code == "IO_NOT_FOUND"
    with pytest.raises(InputError) as err2:
        matrixctl.open_pack(tmp_path)  # an empty folder
    assert err2.value.code == _cli_code(tmp_path) == "UNKNOWN_FOLDER"
    matrixctl.save(tmp_path / "m.zt", _tensors())
    with pytest.raises(FormatError) as err3:
        matrixctl.open_pack(tmp_path / "m.zt")
    assert err3.value.code == "UNKNOWN_FORMAT"


def test_sparse_tensors_are_returned_dense(tmp_path: Path) -> None:
    """Decision (docs/api.md): a sparse zTensor tensor reads as its dense array."""
    import ztensor

    path = tmp_path / "s.zt"
    with ztensor.Writer(str(path)) as w:
        w.add_sparse_csr(
            "sp", np.array([3.0, 4.0], np.float32), np.array([1, 0]), np.array([0, 1, 2]), (2, 2)
        )
    with matrixctl.open(path) as f:
        assert f.infos["sp"].layout == "sparse_csr"
        assert f["sp"].tolist() == [[0.0, 3.0], [4.0, 0.0]]


def test_npy_written_by_numpy_big_endian_reads_as_values(tmp_path: Path) -> None:
    arr = np.arange(6, dtype=">i4").reshape(2, 3)
    np.save(tmp_path / "be.npy", arr)
    with matrixctl.open(tmp_path / "be.npy") as f:
        assert list(f) == ["be"]
        got = f["be"]
        assert got.tolist() == arr.tolist() and got.shape == (2, 3)
