"""GGUF as a convert destination (matrixctl/formats/gguf_write.py): read back by gguf-py's
GGUFReader and listed by gguf-dump; Q8_0 equal to gguf-py's quantizer; typed --meta; alignment;
GGUF -> zTensor 2 -> GGUF keeps tensors and metadata; refusals write nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants
from safetensors.numpy import save_file

from tests.helpers.cli import run_cli

RNG = np.random.default_rng(3)
ARRAYS = {
    "tok.weight": RNG.standard_normal((8, 64)).astype(np.float32),
    "norm": RNG.standard_normal(64).astype(np.float16),
    "bf": RNG.standard_normal((2, 32)).astype(ml_dtypes.bfloat16),
    "odd": RNG.standard_normal((3, 5)).astype(np.float32),
    "ids": np.arange(5, dtype=np.int32),
}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.safetensors"
    save_file(dict(ARRAYS), str(path), metadata={"format": "pt"})
    return path


def fields(path: Path) -> dict[str, tuple[list[int], object]]:
    r = GGUFReader(str(path))
    out = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        value = f.contents()
        out[name] = ([int(t) for t in f.types], value)
    return out


def tensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    r = GGUFReader(str(path))
    return {
        t.name: (t.tensor_type.name, [int(x) for x in t.shape], np.asarray(t.data).tobytes())
        for t in r.tensors
    }


def test_safetensors_to_gguf_reads_back_identically(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    args = ["--meta", "general.architecture=llama", "--meta", "llama.block_count:u32=2"]
    result = run_cli("convert", str(model), str(out), *args, "--meta", "x.scale:f64=0.1")
    assert result.code == 0, result.stderr
    got = tensors(out)
    assert set(got) == set(ARRAYS)
    types = {"tok.weight": "F32", "norm": "F16", "bf": "BF16", "odd": "F32", "ids": "I32"}
    for name, arr in ARRAYS.items():
        gtype, dims, data = got[name]
        assert gtype == types[name]
        assert dims == list(reversed(arr.shape))  # GGUF stores ne[0] (the row) first
        assert data == arr.tobytes()
    f = fields(out)
    assert f["general.architecture"] == ([int(GGUFValueType.STRING)], "llama")
    assert f["llama.block_count"] == ([int(GGUFValueType.UINT32)], 2)
    assert f["x.scale"] == ([int(GGUFValueType.FLOAT64)], 0.1)
    assert f["format"][1] == "pt"
    assert run_cli("verify", str(out)).code == 0
    again = tmp_path / "again.gguf"
    assert run_cli("convert", str(model), str(again), *args, "--meta", "x.scale:f64=0.1").code == 0
    assert again.read_bytes() == out.read_bytes()  # deterministic


def test_gguf_dump_lists_the_output(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    assert run_cli("convert", str(model), str(out), "--quantize", "q8_0").code == 0
    dump = Path(sys.executable).parent / "gguf-dump"
    done = subprocess.run(
        [str(dump), str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "|" in line]
    listed = {line.split("|")[-1].strip(): line.split("|")[-2].strip() for line in lines[-5:]}
    assert listed == {"tok.weight": "Q8_0", "norm": "F16", "bf": "Q8_0", "odd": "F32", "ids": "I32"}
    assert "general.quantization_version" in done.stdout


def test_q8_0_equals_gguf_py_quantizer(model: Path, tmp_path: Path) -> None:
    """Decision (docs/formats/gguf.md, writing): --quantize q8_0 applies to floating tensors
    of rank >= 2 whose rows are whole 32-element blocks; the blocks are ggml's reference
    quantization, pinned here against gguf-py's numpy implementation."""
    out = tmp_path / "q.gguf"
    assert run_cli("convert", str(model), str(out), "--quantize", "q8_0").code == 0
    got = tensors(out)
    for name in ("tok.weight", "bf"):
        values = ARRAYS[name].astype(np.float32)
        want = quants.quantize(values, GGMLQuantizationType.Q8_0).tobytes()
        assert got[name][0] == "Q8_0" and got[name][2] == want
    assert got["odd"][0] == "F32" and got["norm"][0] == "F16"
    # halves round away from zero, as ggml's roundf does
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, 0], x[0, 1] = 127.0, 0.5
    from matrixctl.formats.gguf_write import q8_0

    assert q8_0(x)[2:4] == bytes([127, 1])


def test_alignment_from_metadata(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.gguf"
    assert run_cli("convert", str(model), str(out), "--meta", "general.alignment:u32=64").code == 0
    r = GGUFReader(str(out))
    assert r.alignment == 64
    assert all(t.data_offset % 64 == 0 for t in r.tensors)
    assert tensors(out)["tok.weight"][2] == ARRAYS["tok.weight"].tobytes()


def test_gguf_zt2_gguf_round_trip_keeps_tensors_and_metadata(tmp_path: Path) -> None:
    src = tmp_path / "src.gguf"
    w = GGUFWriter(str(src), "llama")
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_token_list(["<s>", "a", "b"])
    w.add_token_types([3, 1, 1])
    w.add_token_scores([0.0, -1.0, -2.5])
    w.add_bool("x.flag", True)
    w.add_int32("x.neg", -7)
    w.add_uint64("x.big", 1 << 40)
    q = quants.quantize(ARRAYS["tok.weight"], GGMLQuantizationType.Q8_0)
    w.add_tensor("tok.weight", q, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("norm", ARRAYS["norm"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    mid = tmp_path / "mid.zt"
    back = tmp_path / "back.gguf"
    args = ["--zt-version", "2", "--keep-quantized"]
    assert run_cli("convert", str(src), str(mid), *args).code == 0
    assert run_cli("verify", str(mid)).code == 0
    result = run_cli("convert", str(mid), str(back))
    assert result.code == 0, result.stderr
    assert tensors(back) == tensors(src)
    assert fields(back) == fields(src)


def test_refusals_write_nothing(tmp_path: Path) -> None:
    npz = tmp_path / "a.npz"
    np.savez(npz, m=np.zeros(4, dtype=np.uint8))
    out = tmp_path / "o.gguf"
    result = run_cli("convert", str(npz), str(out))
    assert result.code == 1 and "CONVERT_REFUSED" in result.stderr and not out.exists()
    np.savez(npz, m=np.zeros((1, 1, 1, 1, 2), dtype=np.float32))
    assert run_cli("convert", str(npz), str(out)).code == 1 and not out.exists()
    np.savez(npz, m=np.zeros(4, dtype=np.float32))
    assert run_cli("convert", str(npz), str(out), "--quantize", "q4_0").code == 2
    assert run_cli("convert", str(npz), str(out), "--meta", "k:u8=300").code == 2
    assert run_cli("convert", str(npz), str(tmp_path / "o.zt"), "--quantize", "q8_0").code == 2
    assert not out.exists()


@pytest.mark.parametrize(
    ("where", "value", "dtype"),
    [
        ((1, 5), np.nan, np.float32),
        ((2, 40), -np.inf, np.float32),
        ((2, 40), 9e6, np.float32),  # the block's float16 scale would be infinite
        ((0, 3), 1e300, np.float64),  # beyond float32 before it is quantized
        ((3, 63), np.nan, np.float16),
    ],
)
def test_q8_0_refuses_values_it_cannot_hold(
    tmp_path: Path, where: tuple[int, int], value: float, dtype: type
) -> None:
    """Decision (docs/formats/gguf.md, writing): a NaN or infinity (its whole 32-value block
    became NaN) or a magnitude above about 8.3e6 (the block became infinite) is refused with
    GGUF_QUANTIZE naming the tensor and the element; nothing is written, no numpy warning."""
    import warnings

    x = RNG.standard_normal((4, 64)).astype(dtype)
    with np.errstate(over="ignore"):
        x[where] = value
    npz = tmp_path / "a.npz"
    np.savez(npz, w=x)
    out = tmp_path / "o.gguf"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = run_cli("convert", str(npz), str(out), "--quantize", "q8_0")
    assert result.code == 1, result.stderr
    element = where[0] * 64 + where[1]
    assert "error[GGUF_QUANTIZE]" in result.stderr and f"element {element}" in result.stderr
    assert "Warning" not in result.stderr and not out.exists()


def test_q8_0_without_warnings_on_tiny_and_largest_values() -> None:
    """Values so small that 1 / scale overflows float32 give zero quants (they dequantize to
    0, as the float16 scale is 0); the largest values whose scale fits float16 quantize."""
    import warnings

    from matrixctl.formats.gguf_write import q8_0, q8_0_refusal

    tiny = np.full(32, 1e-39, dtype=np.float32)
    big = np.full(32, 8.3e6, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert q8_0_refusal(tiny) is None and q8_0_refusal(big) is None
        assert q8_0(tiny) == bytes(34)
        block = np.frombuffer(q8_0(big), dtype=np.uint8)
    scale = float(block[:2].copy().view("<f2")[0])
    assert np.isfinite(scale) and abs(scale * 127 - 8.3e6) < 8.3e6 * 1e-3
    over = q8_0_refusal(np.full(32, 8.4e6, dtype=np.float32))
    assert over is not None and over[0] == 0 and "range" in over[1]


@pytest.mark.parametrize(
    ("meta", "code"),
    [
        ("general.alignment:u64=64", 2),
        ("general.alignment:i32=64", 2),
        ("general.alignment:bool=true", 2),
        ("general.alignment:u32=0", 2),
        ("general.alignment:u32=48", 2),
        ("general.alignment=abc", 2),
        ("general.alignment=64", 0),  # untyped: a decimal text is the number (uint32)
        ("general.alignment:u32=1", 0),
        ("general.alignment:u32=128", 0),
    ],
)
def test_alignment_is_a_uint32_power_of_two_or_refused(
    model: Path, tmp_path: Path, meta: str, code: int
) -> None:
    """The writer never writes a general.alignment its own verify rejects (a u64, i32 or bool
    one was written): it writes a uint32 power of two or refuses with one line naming the
    option and the type GGUF requires."""
    out = tmp_path / "a.gguf"
    result = run_cli("convert", str(model), str(out), "--meta", meta)
    assert result.code == code, result.stderr
    if code:
        lines = [x for x in result.stderr.splitlines() if not x.startswith("matrixctl: hint")]
        assert len(lines) == 1 and "error[GGUF_WRITE]" in lines[0]
        assert "--meta general.alignment" in lines[0] and "uint32 power of two" in lines[0]
        assert not out.exists()
    else:
        assert run_cli("verify", str(out)).code == 0
        assert GGUFReader(str(out)).fields["general.alignment"].types == [GGUFValueType.UINT32]


def test_padding_is_written_in_bounded_pieces() -> None:
    """A 2^31 alignment pads with zeros 1 MiB at a time, never one 2 GiB buffer."""
    from matrixctl.formats.gguf_write import _zeros

    class Counting:
        total = 0
        largest = 0

        def write(self, data: bytes) -> None:
            self.total += len(data)
            self.largest = max(self.largest, len(data))

    fp = Counting()
    _zeros(fp, (1 << 31) - 5)
    assert fp.total == (1 << 31) - 5 and fp.largest == 1 << 20
