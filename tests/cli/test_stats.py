"""`inspect --stats`: numbers checked against numpy on the same arrays, computed here."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from matrixctl import stats
from tests.helpers.cli import FIXTURES, run_cli


def expected(values: np.ndarray) -> dict:
    """What the stats of `values` must be, straight from numpy."""
    x = np.asarray(values)
    if x.dtype == np.bool_:
        x = x.astype(np.uint8)
    flat = x.reshape(-1).astype(np.float64)
    finite = flat[np.isfinite(flat)]
    integer = x.dtype.kind in "iu"
    return {
        "count": int(x.size),
        "min": (int(x.min()) if integer else float(finite.min())) if finite.size else None,
        "max": (int(x.max()) if integer else float(finite.max())) if finite.size else None,
        "mean": float(finite.mean()) if finite.size else None,
        "std": float(finite.std()) if finite.size else None,
        "zeros": int(np.count_nonzero(flat == 0)),
        "nan": int(np.count_nonzero(np.isnan(flat))),
        "inf": int(np.count_nonzero(np.isinf(flat))),
    }


def assert_same(got: dict, want: dict, name: str = "") -> None:
    assert set(got) == set(want), name
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (name, key)
        else:
            assert got[key] == value, (name, key)


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    special = rng.standard_normal(1000).astype(np.float32)
    special[[3, 50, 999]] = np.nan
    special[[7, 8]] = np.inf
    special[9] = -np.inf
    special[100:140] = 0.0
    special[141] = -0.0
    return {
        "special": special.reshape(10, 100),
        "ints": rng.integers(-(2**31), 2**31 - 1, size=(33, 7), dtype=np.int32),
        "big_u64": np.array([0, 2**63, 2**64 - 1, 5], dtype=np.uint64),
        "flags": rng.random(77) < 0.3,
        "half": rng.standard_normal(64).astype(np.float16),
        "brain": rng.standard_normal(96).astype(ml_dtypes.bfloat16),
        "bytes": rng.integers(0, 256, size=500, dtype=np.uint8),
        "all_nan": np.full(4, np.nan, dtype=np.float64),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


@pytest.fixture(scope="module")
def st_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.numpy import save_file

    path = tmp_path_factory.mktemp("stats") / "a.safetensors"
    save_file(arrays(), str(path))
    return path


def test_tensor_stats_match_numpy(st_file: Path) -> None:
    """NaN and Inf are counted and left out of min, max, mean and std; -0.0 counts as a zero;
    a tensor of NaN only has no min; uint64 min and max are exact integers."""
    rows = {r["name"]: r for r in stats.tensor_stats(str(st_file))}
    for name, values in arrays().items():
        assert_same(rows[name]["stats"], expected(values), name)
    assert rows["special"]["stats"]["nan"] == 3 and rows["special"]["stats"]["inf"] == 3
    assert rows["special"]["stats"]["zeros"] == 41
    assert rows["big_u64"]["stats"]["max"] == 2**64 - 1
    assert rows["all_nan"]["stats"]["min"] is None


@pytest.mark.parametrize("ext", [".zt", ".npz", ".stb"])
def test_every_container_gives_the_same_numbers(st_file: Path, tmp_path: Path, ext: str) -> None:
    out = tmp_path / f"a{ext}"
    keep = ["--exclude", "brain"] if ext == ".npz" else []  # numpy has no bf16
    if ext == ".stb":
        keep = [a for t in ("special", "ints", "half") for a in ("--select", t)]
    args = ["convert", str(st_file), str(out), "-q", *keep]
    if ext == ".zt":
        args += ["--compress", "zstd"]  # decoded pieces need not end on an element
    assert run_cli(*args).code == 0
    rows = {r["name"]: r for r in stats.tensor_stats(str(out))}
    values = arrays()
    for name, row in rows.items():
        assert_same(row["stats"], expected(values[name]), f"{ext} {name}")
    assert len(rows) >= 3


def test_npy_and_embd(tmp_path: Path) -> None:
    values = np.linspace(-3, 5, 1001, dtype=np.float64)
    values[17] = np.inf
    np.save(tmp_path / "v.npy", values)
    (row,) = stats.tensor_stats(str(tmp_path / "v.npy"))
    assert_same(row["stats"], expected(values))
    from tests.formats.test_hf_model import make_model, tiny_weights

    assert (
        run_cli("convert", str(make_model(tmp_path / "m")), str(tmp_path / "m.weights")).code == 0
    )
    weights = tiny_weights()
    for row in stats.tensor_stats(str(tmp_path / "m.weights")):
        assert_same(row["stats"], expected(weights[row["name"]]), row["name"])


def test_a_tensor_bigger_than_the_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks merge exactly: a 1,000-element chunk size over 250,007 values, with an offset that
    would lose digits in a naive sum of squares."""
    from safetensors.numpy import save_file

    monkeypatch.setattr(stats, "CHUNK_ELEMENTS", 1000)
    rng = np.random.default_rng(1)
    big = (1e6 + rng.standard_normal(250_007)).astype(np.float64)
    big[123_456] = np.nan
    big[200_000:200_010] = 0
    save_file({"big": big}, str(tmp_path / "b.safetensors"))
    (row,) = stats.tensor_stats(str(tmp_path / "b.safetensors"))
    assert_same(row["stats"], expected(big))


def test_sparse_tensors_count_their_implicit_zeros(tmp_path: Path) -> None:
    import ztensor

    path = tmp_path / "s.zt"
    dense = np.array([[0, 3.5, 0, 0], [-2, 0, 0, 7]], dtype=np.float32)
    with ztensor.Writer(str(path)) as w:
        w.add_sparse_csr(
            "sp",
            np.array([3.5, -2, 7], np.float32),
            np.array([1, 0, 3]),
            np.array([0, 1, 3]),
            (2, 4),
        )
    (row,) = stats.tensor_stats(str(path))
    assert_same(row["stats"], expected(dense))


def test_gguf_is_dequantized_and_kept_blocks_are_not_computed(tmp_path: Path) -> None:
    from tests.helpers import ggufcraft

    path = tmp_path / "m.gguf"
    values = ggufcraft.write_model(path, extra=True)
    rows = {r["name"]: r for r in stats.tensor_stats(str(path))}
    assert set(rows) == set(values)
    for name, want in values.items():
        got = rows[name]["stats"]
        ref = expected(want)
        assert got["count"] == ref["count"] and got["zeros"] == ref["zeros"], name
        for key in ("min", "max", "mean", "std"):  # gguf's own dequantizer vs ours
            assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), (name, key)
    zt = tmp_path / "q.zt"
    assert run_cli("convert", str(path), str(zt), "--keep-quantized", "-q").code == 0
    kept = {r["name"]: r["stats"] for r in stats.tensor_stats(str(zt))}
    assert kept["token_embd.weight"] == {"not_computed": "quantized: not computed"}


def test_inspect_stats_json_and_terminal(st_file: Path) -> None:
    result = run_cli("inspect", "--stats", "--json", str(st_file))
    assert result.code == 0, result.stderr
    (doc,) = result.json()["files"]
    by_name = {row["name"]: row["stats"] for row in doc["tensors"]}
    assert_same(by_name["special"], expected(arrays()["special"]))
    again = run_cli("inspect", "--stats", "--json", str(st_file))
    assert again.stdout == result.stdout  # same bytes every time
    shown = run_cli("inspect", "--stats", str(st_file))
    assert shown.code == 0 and shown.stdout == b""
    for word in ("NaN", "Inf", "zeros", "special", "std"):
        assert word in shown.stderr
    (plain,) = run_cli("inspect", "--json", str(st_file)).json()["files"]
    assert "stats" not in plain["tensors"][0]  # only on request: it reads the payload


def test_stats_are_not_computed_for_a_damaged_file(st_file: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(st_file.read_bytes()[:-10])
    result = run_cli("inspect", "--stats", "--json", str(cut))
    assert result.code == 1
    (doc,) = result.json()["files"]
    assert [f["code"] for f in doc["findings"]] == ["ST_TRUNCATED"]
    assert all(row["stats"] is None for row in doc["tensors"])
    shown = run_cli("inspect", "--stats", str(cut))
    assert "structural checks failed" in shown.stderr and "Traceback" not in shown.stderr


# Token files --------------------------------------------------------------------------------


RECORD = np.dtype(
    [("offset", "<u8"), ("length", "<u8"), ("source", "<u4"), ("reserved", "<u4"), ("item", "<u8")]
)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pack") / "pack"
    corpus = FIXTURES / "corpus"
    result = run_cli("ingest", "docs", str(corpus), "-o", str(out), "--atom-size", "64", "-q")
    assert result.code == 0, result.stderr
    return out


def test_pack_stats_match_the_files(pack: Path) -> None:
    """Decision: lengths are binned by powers of two ([1, 1], [2, 3], [4, 7], ...), ids are
    counted over the documents' tokens (padding apart), and each id's text comes from the
    pack's own map."""
    lengths = np.frombuffer((pack / "doc_index.bin").read_bytes(), RECORD, offset=48)["length"]
    atoms = (pack / "matrix_atoms.bin").read_bytes()
    token_count = int.from_bytes(atoms[0x20:0x28], "little")
    ids = np.frombuffer(atoms, "<u2", offset=64)
    assert ids.size == token_count
    tokens = int(lengths.sum())
    smap = json.loads((pack / "pi_symbol_map.json").read_text())
    texts = {s["id"]: s["text"] for s in smap["symbols"]}
    got = stats.pack_stats(str(pack))
    assert got["documents"] == lengths.size > 3
    assert got["tokens"] == tokens
    assert got["padding"] == token_count - tokens
    assert got["padding_share"] == pytest.approx((token_count - tokens) / token_count)
    bins: dict[int, int] = {}
    for n in lengths.tolist():
        k = int(n).bit_length() - 1
        bins[k] = bins.get(k, 0) + 1
    hist = {row["from"]: row["documents"] for row in got["length_histogram"]}
    assert {f: d for f, d in hist.items() if d} == {1 << k: d for k, d in bins.items()}
    assert all(row["to"] == 2 * row["from"] - 1 for row in got["length_histogram"])
    values, counts = np.unique(ids[:tokens], return_counts=True)
    order = sorted(zip(counts.tolist(), values.tolist(), strict=True), key=lambda c: (-c[0], c[1]))
    top = got["top_ids"]
    assert [(r["count"], r["id"]) for r in top] == order[: len(top)] and len(top) == 10
    for row in top:
        if row["role"] is None:
            assert row["text"] == texts[row["id"]]
    eos = [r for r in top if r["id"] == smap["eos_id"]]
    assert eos and eos[0]["role"] == "eos"  # one per document: always among the top


def test_inspect_pack_stats_terminal_escapes_text(pack: Path) -> None:
    shown = run_cli("inspect", "--stats", str(pack))
    assert shown.code == 0
    assert "padding share" in shown.stderr and "█" in shown.stderr
    assert "'\\n'" in shown.stderr  # a newline token is shown escaped, in quotes
    (doc,) = run_cli("inspect", "--stats", "--json", str(pack)).json()["files"]
    assert doc["stats"] == json.loads(json.dumps(stats.pack_stats(str(pack))))


def test_atom_file_and_token_stream_alone(tmp_path: Path) -> None:
    ids = [5, 6, 7, 5, 5, 9, 1]
    src = tmp_path / "ids.txt"
    src.write_text(" ".join(map(str, ids)))
    assert run_cli("pack", "atoms", str(src), "-n", "4", "-o", str(tmp_path / "a.bin")).code == 0
    got = stats.atom_stats(str(tmp_path / "a.bin"))
    assert got["tokens"] == 8  # padded to whole atoms with pad id 0
    assert got["top_ids"][0] == {"id": 5, "count": 3, "share": 3 / 8}
    text = tmp_path / "t.txt"
    text.write_text("aaa bb")
    assert run_cli("tokenize", "pi", "encode", str(text), "-o", str(tmp_path / "t.mxt")).code == 0
    (doc,) = run_cli("inspect", "--stats", "--json", str(tmp_path / "t.mxt")).json()["files"]
    assert doc["stats"]["documents"] == 1
    assert doc["stats"]["tokens"] == sum(r["count"] for r in doc["stats"]["top_ids"])


def test_histogram_bins_are_exact_at_powers_of_two() -> None:
    lengths = np.array([1, 2, 3, 4, 7, 8, 2**40 - 1, 2**40], dtype=np.uint64)
    rows = stats.length_histogram(lengths)
    got = {r["from"]: r["documents"] for r in rows if r["documents"]}
    assert got == {1: 1, 2: 2, 4: 2, 8: 1, 2**39: 1, 2**40: 1}
    assert not math.isnan(rows[0]["from"])


def test_piped_stdin_gets_no_numbers_and_no_false_finding(tmp_path: Path) -> None:
    """A pipe is consumed by the checks: --stats says it needs a file instead of failing."""
    np.save(tmp_path / "v.npy", np.arange(4, dtype=np.int16))
    data = (tmp_path / "v.npy").read_bytes()
    shown = run_cli("inspect", "--stats", "-", stdin=data)
    assert shown.code == 0 and "stdin is a pipe" in shown.stderr
    (doc,) = run_cli("inspect", "--stats", "--json", "-", stdin=data).json()["files"]
    assert doc["findings"] == [] and doc["tensors"][0]["stats"] is None


def test_float64_overflow_gives_null_mean_not_infinity() -> None:
    """Decision: a mean or std beyond float64 (values near 1.8e308 summed) is null, so the JSON
    stays JSON (no Infinity) and no numpy warning reaches stderr."""
    acc = stats.Moments()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc.add(np.array([1.7e308, 1.7e308, 1.0], dtype=np.float64))
    got = acc.to_json()
    assert got["max"] == 1.7e308 and got["min"] == 1.0
    assert got["mean"] is None and got["std"] is None
    json.dumps(got, allow_nan=False)
