"""What a new user meets first: output format names, folder errors, hints, plain words."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import ROOT, run_cli


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr
    return [ln for ln in stderr.splitlines() if "error[" in ln]


@pytest.fixture
def npz(tmp_path: Path) -> Path:
    path = tmp_path / "w.npz"
    np.savez(path, emb=np.arange(12, dtype="<f4").reshape(3, 4))
    return path


# convert --to ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("to", "magic"),
    [("zt", b"ZTEN1000"), ("ztensor", b"ZTEN1000"), ("ZT", b"ZTEN1000"), ("npy", b"\x93NUMPY")],
)
def test_to_takes_short_names(tmp_path: Path, npz: Path, to: str, magic: bytes) -> None:
    """Decision: `--to` takes a format's name, an output extension without its dot (zt,
    weights, ...) or `st` for safetensors, in any case."""
    out = tmp_path / "out.bin"
    result = run_cli("convert", str(npz), str(out), "--to", to)
    assert result.code == 0, result.stderr
    assert out.read_bytes().startswith(magic)


def test_to_st_writes_safetensors_and_weights_names_embd(tmp_path: Path, npz: Path) -> None:
    from matrixctl.converters import destination_format

    out = tmp_path / "out.bin"
    assert run_cli("convert", str(npz), str(out), "--to", "st", "--json").json()["to"] == (
        "safetensors"
    )
    (doc,) = run_cli("inspect", "--json", str(out)).json()["files"]
    assert doc["format"] == "safetensors" and doc["tensors"][0]["name"] == "emb"
    assert destination_format("model.bin", "weights") == "embd"
    assert destination_format("model.bin", "stb") == "stb"


def test_formats_that_cannot_be_written_are_never_offered(tmp_path: Path, npz: Path) -> None:
    """Decision: the output formats in help, errors and docs are the formats whose codec has
    a sink (plus svg): hf-model-dir is read, never offered as an output (gguf was refused the
    same way until its writer landed, and then appeared by itself)."""
    from matrixctl.converters import writable_formats

    assert list(writable_formats()) == [
        "embd", "gguf", "hf-parquet", "ingest-pack", "matrix-atom", "mds", "megatron", "npy", "npz",
        "safetensors", "stb", "svg", "token-stream", "ztensor", "ztensor-v2",
    ]  # fmt: skip
    help_text = " ".join(run_cli("convert", "--help").out.split())
    offered = help_text.split("does not tell it:", 1)[1].split(".", 1)[0]
    for name in ("ztensor (or zt)", "safetensors (or st)", "embd (or weights)", "svg"):
        assert name in offered
    assert "gguf" in offered
    for name in ("hf-model-dir", "stb-sidecar"):
        assert name not in offered
    for to in ("hf-model-dir",):
        result = run_cli("convert", str(npz), str(tmp_path / "x.out"), "--to", to)
        assert result.code == 2
        (line,) = error_lines(result.stderr)
        assert f"error[CONVERT_UNSUPPORTED]: convert reads {to} but cannot write it" in line
        assert "hf-model-dir" not in result.stderr.split("hint:", 1)[1]
    unknown = run_cli("convert", str(npz), str(tmp_path / "x.out"), "--to", "pdf")
    assert unknown.code == 2 and "ztensor (or zt)" in unknown.stderr
    assert not list(tmp_path.glob("x.out*"))


def test_a_container_that_gains_a_writer_is_offered_by_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The output list is derived from the registry: giving GGUF's codec a sink (as a GGUF
    writer would) makes `gguf` an output everywhere without another edit."""
    from matrixctl import converters
    from matrixctl.formats import gguf, ztensor

    monkeypatch.setitem(gguf.TENSOR_IO, gguf.FORMAT, (gguf.GgufSource, ztensor.ZtSink))
    assert "gguf" in converters.writable_formats()
    assert converters.destination_format("m.out", "gguf") == "gguf"
    assert "gguf" in run_cli("convert", "--help").out


# Folders ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "says"),
    [
        (
            ["model.safetensors.index.json", "model-00001-of-00002.safetensors"],
            "has model.safetensors.index.json but no config.json",
        ),
        (["model.safetensors"], "has model.safetensors but no config.json"),
        (["config.json"], "has config.json but no model.safetensors"),
        ([], "without the files of any folder format (ingest-pack: ingest_manifest.json; "),
        (["notes.txt"], "hf-model-dir: config.json + model.safetensors"),
    ],
)
@pytest.mark.parametrize("command", ["convert", "inspect", "verify"])
def test_a_folder_that_is_no_format_says_what_it_lacks(
    tmp_path: Path, files: list[str], says: str, command: str
) -> None:
    """Decision: a folder no folder format claims is UNKNOWN_FOLDER (exit 2, as an input that
    cannot be read), and the message names the files it lacks, never IO_IS_DIR."""
    folder = tmp_path / "model"
    folder.mkdir()
    for name in files:
        (folder / name).write_text("{}")
    args = (
        [str(folder), str(tmp_path / "out.safetensors")] if command == "convert" else [str(folder)]
    )
    result = run_cli(command, *args)
    assert result.code == 2
    text = " ".join(result.stderr.split())  # the report's table wraps long messages
    assert "IO_IS_DIR" not in text and "UNKNOWN_FOLDER" in text and says in text
    if command == "convert":
        (line,) = error_lines(result.stderr)
        assert line.startswith(f"matrixctl: error[UNKNOWN_FOLDER]: {folder}: ")
        assert not (tmp_path / "out.safetensors").exists()


# Hints -----------------------------------------------------------------------------------------

OPTION = re.compile(r"(?<![\w`'-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")
# Modules every command goes through: their hints may name only options every command has.
SHARED = {
    "matrixctl/io.py",
    "matrixctl/errors.py",
    "matrixctl/cli/common.py",
    "matrixctl/cli/app.py",
}


def hint_texts() -> list[tuple[str, int, str]]:
    """Every `hint=` given in the package: (module path, line, its literal text; the fixed
    parts of an f-string)."""
    found = []
    for path in sorted((ROOT / "matrixctl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.keyword) or node.arg != "hint":
                continue
            parts = [
                n.value
                for n in ast.walk(node.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            if parts:
                found.append((str(path.relative_to(ROOT)), node.lineno, " ".join(parts)))
    return found


def test_every_hint_names_only_options_its_commands_have() -> None:
    """A hint never names an option its command lacks: hints in a command module name options
    of that module's commands, hints in the modules every command shares (io, errors, common)
    only options every command has, and any other hint an option some command has."""
    from matrixctl.cli.docgen import commands

    leaves = [cmd for _, cmd in commands() if not getattr(cmd, "commands", None)]
    opts = {id(c): {o for p in c.params for o in (*p.opts, *p.secondary_opts)} for c in leaves}
    everywhere = set.intersection(*opts.values())
    anywhere = set.union(*opts.values())
    texts = hint_texts()
    assert len(texts) > 20  # the scan finds the hints
    bad = []
    for module, line, text in texts:
        named = set(OPTION.findall(text))
        if module in SHARED:
            allowed = everywhere
        elif module.startswith("matrixctl/cli/"):
            mod = module[:-3].replace("/", ".")
            own = [opts[id(c)] for c in leaves if c.callback.__module__ == mod]
            allowed = set.union(*own) if own else everywhere
        else:
            allowed = anywhere
        bad += [f"{module}:{line} names {o}" for o in sorted(named - allowed)]
    assert not bad, bad


def test_binary_to_a_terminal_hint_names_no_option() -> None:
    """`convert` has no -o: the hint for binary output to a terminal names none."""
    from matrixctl import io
    from matrixctl.errors import UsageError

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(io, "stdout_is_terminal", lambda: True)
        with pytest.raises(UsageError) as info:
            io.refuse_binary_to_terminal("-")
    assert info.value.hint is not None and not OPTION.findall(info.value.hint)


# Plain words -----------------------------------------------------------------------------------

# Project and spec jargon a user cannot be expected to know. Each may appear only explained:
# a hash name in brackets after what it is ("the config hash (H_TOK)"), KHΛNARY next to the word
# runtime, AGL only in the manifest's literal format name (AGL-TOK-MANIFEST-V1).
JARGON = re.compile(
    r"KHΛNARY|G_LOAD_BIN_TENSOR|\bAGL\b(?!-TOK)|\bH_[A-Z_]+\b|substrate|PAD-BYTE|"
    r"\bpi (?:public |private )?keys?\b|pi-signatures?"
)


def unexplained(text: str) -> list[str]:
    text = " ".join(text.split())
    text = re.sub(r"\((?:the )?H_[A-Z_]+\b", "", text)  # "the config hash (H_TOK)"
    if "runtime" in text:
        text = re.sub(r"KHΛNARY|G_LOAD_BIN_TENSOR", "", text)
    return JARGON.findall(text)


def test_help_texts_and_code_summaries_use_plain_words() -> None:
    """Help texts and diagnostic summaries explain or avoid project jargon (KHΛNARY, AGL, H_TOK
    and the like): they say what the thing is."""
    from matrixctl.cli.docgen import commands, import_everything
    from matrixctl.codes import CODES

    import_everything()
    texts = []
    for path, cmd in commands():
        texts.append((" ".join(path), cmd.help or ""))
        texts += [
            (f"{' '.join(path)} {p.name}", getattr(p, "help", None) or "") for p in cmd.params
        ]
    texts += [(info.code, info.summary) for info in CODES.values()]
    bad = {where: found for where, text in texts if (found := unexplained(text))}
    assert not bad, bad
    # The check finds what it must: four unexplained terms here, none once explained.
    found = unexplained("signed by a pi key over H_TOK, an AGL manifest, for KHΛNARY")
    assert sorted(found) == ["AGL", "H_TOK", "KHΛNARY", "pi key"]
    assert unexplained("the config hash (H_TOK) of AGL-TOK-MANIFEST-V1, the KHΛNARY runtime") == []


# Self-contained --------------------------------------------------------------------------------


def test_tests_demo_tools_and_ci_read_nothing_beside_the_repository() -> None:
    """Everything `make test` and `make demo` read is in the repository (fixtures/README.md
    says where it came from) or installed by make: no test, tool, benchmark, Makefile rule or CI
    step names a folder beside the checkout."""
    # Spelled in pieces so this file does not match itself.
    outside = re.compile("|".join(re.escape(s) for s in ("../" + "shared", "/" + "work/")))
    files = [ROOT / "Makefile", ROOT / ".ci" / "run"]
    for folder in ("tests", "tools", "bench"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".sh")]
    assert len(files) > 40
    bad = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if outside.search(line) and not line.lstrip().startswith("#")
    ]
    assert not bad, bad


@pytest.mark.parametrize(
    "words",
    [
        ["convert", "x.zt", "-"],
        ["pack", "atoms", "x", "-n", "4", "-o", "-"],
        ["pack", "svgt", "x", "--grid", "4x4", "-o", "-"],
        ["tokenize", "scx", "sign", "x", "-k", "k", "-o", "-"],
        ["tokenize", "scx", "encode", "x", "-r", "r", "-o", "-"],
        ["tokenize", "scx", "decode", "x", "-r", "r", "-o", "-"],
    ],
)
def test_json_with_output_to_stdout_is_one_refusal(words: list[str]) -> None:
    """Every command with an output file and --json refuses `-` as that file the same way
    (`cli.common.json_needs_stdout`), before it reads anything: exit 2, one error line, and
    the failure document alone on stdout."""
    run = run_cli(*words, "--json")
    assert run.code == 2
    assert error_lines(run.stderr) == [
        "matrixctl: error[USAGE]: --json needs stdout, so the output cannot be - as well"
    ]
    assert run.json()["error"]["message"] == (
        "--json needs stdout, so the output cannot be - as well"
    )
