"""The SCX commands: tokenize scx keygen|sign|encode|decode, pack shards, inspect and verify."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from matrixctl.tokenizers.scx import signing
from tests.helpers import scx_golden
from tests.helpers.cli import run_cli


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    res = run_cli("tokenize", "scx", "keygen", "-o", str(tmp_path / "pi.key"))
    assert res.code == 0, res.stderr
    return tmp_path / "pi.key"


@pytest.fixture
def signed(tmp_path: Path, keys: Path) -> Path:
    src = tmp_path / "src.json"
    src.write_text(json.dumps(scx_golden.SOURCE))
    out = tmp_path / "reg.scxr"
    res = run_cli("tokenize", "scx", "sign", str(src), "-o", str(out), "--key", str(keys))
    assert res.code == 0, res.stderr
    return out


def test_keygen_writes_private_0600_and_public_and_never_prints_the_key(tmp_path: Path) -> None:
    res = run_cli("tokenize", "scx", "keygen", "-o", str(tmp_path / "k"), "--json")
    assert res.code == 0
    doc = res.json()
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600
    private = (tmp_path / "k").read_text()
    assert "PRIVATE KEY" in private
    assert private.splitlines()[1] not in res.out + res.stderr
    pub = (tmp_path / "k.pub").read_text().split()
    assert pub[0] == "pi-ed25519" and pub[1] == doc["public_key"] and pub[2] == doc["key_id"]
    again = run_cli("tokenize", "scx", "keygen", "-o", str(tmp_path / "k"))
    assert again.code == 2 and "--force" in again.stderr
    assert run_cli("tokenize", "scx", "keygen", "-o", "-").code == 2


def test_sign_and_inspect_registry(tmp_path: Path, signed: Path, keys: Path) -> None:
    res = run_cli("inspect", "--json", str(signed))
    assert res.code == 0
    doc = res.json()["files"][0]
    assert doc["format"] == "scx-registry"
    assert doc["hashes"]["H_REG"] == scx_golden.H_REG.hex()
    assert doc["signatures"][0]["key_id"] == signing.key_id(
        bytes.fromhex((Path(str(keys) + ".pub")).read_text().split()[1])
    )
    # The JSON view is itself a source: signing it again gives the same bytes.
    view = tmp_path / "view.json"
    view.write_bytes(res.stdout)
    again = tmp_path / "again.scxr"
    assert (
        run_cli("tokenize", "scx", "sign", str(view), "-o", str(again), "--key", str(keys)).code
        == 0
    )
    assert again.read_bytes() == signed.read_bytes()


def test_sign_errors(tmp_path: Path, keys: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"lane_mode": "SCXQ9"}')
    res = run_cli(
        "tokenize", "scx", "sign", str(bad), "-o", str(tmp_path / "o"), "--key", str(keys)
    )
    assert res.code == 1 and "SCX_REG_SOURCE" in res.stderr
    assert not (tmp_path / "o").exists()
    res = run_cli(
        "tokenize",
        "scx",
        "sign",
        str(bad),
        "-o",
        str(tmp_path / "o"),
        "--key",
        str(tmp_path / "nokey"),
    )
    assert res.code == 2 and "IO_NOT_FOUND" in res.stderr
    os.chmod(keys, 0o644)
    res = run_cli(
        "tokenize", "scx", "sign", str(bad), "-o", str(tmp_path / "o"), "--key", str(keys)
    )
    assert res.code == 2 and "SCX_KEY_FILE" in res.stderr


def test_sign_with_parent_checks_append_only(tmp_path: Path, signed: Path, keys: Path) -> None:
    from matrixctl.tokenizers.scx import registry as scx_registry

    parent = scx_registry.parse(signed.read_bytes())
    child = {**scx_golden.SOURCE, "revision": 1, "parent": parent.h_reg.hex(),
             "composites": [*scx_golden.SOURCE["composites"], {"text": "in"}]}  # fmt: skip
    src = tmp_path / "child.json"
    src.write_text(json.dumps(child))
    out = tmp_path / "child.scxr"
    assert (
        run_cli("tokenize", "scx", "sign", str(src), "-o", str(out), "--key", str(keys)).code == 2
    )
    res = run_cli(
        "tokenize",
        "scx",
        "sign",
        str(src),
        "-o",
        str(out),
        "--key",
        str(keys),
        "--parent",
        str(signed),
    )
    assert res.code == 0, res.stderr
    child["composites"] = child["composites"][1:]
    src.write_text(json.dumps(child))
    res = run_cli(
        "tokenize",
        "scx",
        "sign",
        str(src),
        "-o",
        str(out),
        "--key",
        str(keys),
        "--parent",
        str(signed),
    )
    assert res.code == 1 and "SCX_REG_NOT_APPEND_ONLY" in res.stderr


def test_encode_decode_round_trip_and_pipe_into_pack_atoms(
    tmp_path: Path, signed: Path, keys: Path
) -> None:
    data = b"the theme of the thing is the end " * 50
    pub = str(keys) + ".pub"
    enc = run_cli("tokenize", "scx", "encode", "-r", str(signed), "--trust", pub, stdin=data)
    assert enc.code == 0, enc.stderr
    assert enc.stdout.startswith(b"MXTOKENS")
    dec = run_cli("tokenize", "scx", "decode", "-r", str(signed), "--trust", pub, stdin=enc.stdout)
    assert dec.code == 0 and dec.stdout == data
    atoms = tmp_path / "atoms.bin"
    packed = run_cli("pack", "atoms", "-", "-o", str(atoms), "-n", "16", stdin=enc.stdout)
    assert packed.code == 0 and atoms.read_bytes().startswith(b"MTRXATOM")
    two = run_cli(
        "tokenize", "scx", "encode", "-r", str(signed), "--trust", pub, "--jobs", "2", stdin=data
    )
    assert two.stdout == enc.stdout


def test_encode_jobs_write_the_bytes_of_one_thread(
    tmp_path: Path, keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle of 9 bytes (no power of two: one thread's reads and the threads' ranges cut
    the tokens into other arrays), many frames, a file and a pipe: `--jobs 2` and `--jobs 3`
    write the bytes of `--jobs 1`, in frames of FRAME_TOKENS."""
    from matrixctl.cli import tokenize_scx
    from matrixctl.formats import token_stream
    from matrixctl.tokenizers.scx import encoder

    monkeypatch.setattr(tokenize_scx, "FRAME_TOKENS", 1000)
    monkeypatch.setattr(encoder, "READ_BYTES", 10_000)
    monkeypatch.setattr(encoder, "TASK_BYTES", 7_000)
    src = tmp_path / "src.json"
    src.write_text(json.dumps({"lane_mode": "CUSTOM", "lane_width": 3,
                               "alignment": {"bundle_lanes": 3, "chunk_bytes": 18,
                                             "shard_bundles": 4},
                               "composites": [{"text": "the"}, {"text": " th"}]}))  # fmt: skip
    reg = tmp_path / "reg.scxr"
    signed = run_cli("tokenize", "scx", "sign", str(src), "-o", str(reg), "--key", str(keys))
    assert signed.code == 0, signed.stderr
    data = (b"the theme of the thing is the end \x00\x01" * 2000)[:70_001]
    (tmp_path / "in.bin").write_bytes(data)
    args = ["tokenize", "scx", "encode", "-r", str(reg), "--trust", str(keys) + ".pub", "-q"]
    outs = {}
    for jobs in ("1", "2", "3"):
        res = run_cli(*args, str(tmp_path / "in.bin"), "-o", str(tmp_path / f"{jobs}.mxt"),
                      "-j", jobs)  # fmt: skip
        assert res.code == 0, res.stderr
        outs[jobs] = (tmp_path / f"{jobs}.mxt").read_bytes()
        piped = run_cli(*args, "-j", jobs, stdin=data)
        assert piped.code == 0 and piped.stdout == outs["1"]
    assert outs["2"] == outs["1"] and outs["3"] == outs["1"]
    with open(tmp_path / "1.mxt", "rb") as fp:
        header = token_stream.StreamHeader.parse(fp.read(token_stream.HEADER_SIZE))
        events = token_stream.iter_events(fp, header)
        sizes = [e.tokens.size for e in events if e.kind == token_stream.KIND_TOKENS]
    assert len(sizes) > 3 and set(sizes[:-1]) == {1000} and 0 < sizes[-1] <= 1000
    dec = run_cli("tokenize", "scx", "decode", "-r", str(reg), "--trust", str(keys) + ".pub",
                  str(tmp_path / "2.mxt"))  # fmt: skip
    assert dec.code == 0 and dec.stdout == data


def test_encode_json_summary_and_debug_markers(tmp_path: Path, signed: Path, keys: Path) -> None:
    src = tmp_path / "in.bin"
    src.write_bytes(b"the cat")
    out = tmp_path / "t.mxt"
    res = run_cli("tokenize", "scx", "encode", str(src), "-o", str(out), "-r", str(signed),
                  "--trust", str(keys) + ".pub", "--debug-markers", "--json")  # fmt: skip
    assert res.code == 0
    doc = res.json()
    assert doc["bytes"] == 7 and doc["tokens"] == 33 + len(scx_golden.VECTORS[2][3])
    assert doc["warnings"] == [] and doc["padding"] == 1  # bundles of 4 bytes
    strict = run_cli("tokenize", "scx", "encode", str(src), "-o", str(tmp_path / "s.mxt"), "-r",
                     str(signed), "--trust", str(keys) + ".pub", "--strict-alignment")  # fmt: skip
    assert strict.code == 1 and "MISALIGNED_SHARD" in strict.stderr and "offset 4" in strict.stderr
    assert not (tmp_path / "s.mxt").exists()


@pytest.mark.parametrize("size", [0, 1, 7, 16, 17, 1000])
def test_encode_quiet_prints_nothing_whatever_the_length(
    tmp_path: Path, signed: Path, keys: Path, size: int
) -> None:
    """Decision: -q prints nothing on success, also when the last bundle is padded (any length
    that is not a whole number of bundles): padding is not a warning (docs/formats/scx.md)."""
    res = run_cli("tokenize", "scx", "encode", "-q", "-o", str(tmp_path / "t.mxt"),
                  "-r", str(signed), "--trust", str(keys) + ".pub", stdin=b"x" * size)  # fmt: skip
    assert res.code == 0 and res.stderr == "" and res.stdout == b""
    loud = run_cli("tokenize", "scx", "encode", "-o", str(tmp_path / "u.mxt"),
                   "-r", str(signed), "--trust", str(keys) + ".pub", stdin=b"x" * size)  # fmt: skip
    assert loud.code == 0 and "warning" not in loud.stderr and "encoded" in loud.stderr


def test_pack_shards_quiet_prints_nothing_when_it_pads(
    tmp_path: Path, signed: Path, keys: Path
) -> None:
    """Decision: `pack shards` pads the last bundle without a warning too (the summary's
    `padding` says how much), so -q prints nothing on success."""
    src = tmp_path / "in.bin"
    src.write_bytes(b"x" * 7)  # bundles of 4 bytes: 1 byte of padding
    args = ["pack", "shards", str(src), "-r", str(signed), "--trust", str(keys) + ".pub"]
    res = run_cli(*args, "-o", str(tmp_path / "a"), "-q")
    assert res.code == 0 and res.stderr == "" and res.stdout == b""
    doc = run_cli(*args, "-o", str(tmp_path / "b"), "--json").json()
    assert doc["padding"] == 1 and doc["warnings"] == []


def test_encode_refuses_untrusted_configs(tmp_path: Path, signed: Path) -> None:
    res = run_cli(
        "tokenize", "scx", "encode", "-r", str(signed), stdin=b"x", env={"MATRIXCTL_SCX_TRUST": ""}
    )
    assert res.code == 1 and "UNSIGNED_REGISTRY" in res.stderr and "--trust" in res.stderr
    other = tmp_path / "other.pub"
    other.write_text(signing.public_line(signing.generate()[0].public_key))
    res = run_cli("tokenize", "scx", "encode", "-r", str(signed), "--trust", str(other), stdin=b"x")
    assert res.code == 1 and "UNSIGNED_REGISTRY" in res.stderr
    env_ok = run_cli("tokenize", "scx", "encode", "-r", str(signed), stdin=b"x",
                     env={"MATRIXCTL_SCX_TRUST": str(signed.parent / "pi.key.pub")})  # fmt: skip
    assert env_ok.code == 0


def test_decode_errors_name_code_and_token(tmp_path: Path, signed: Path, keys: Path) -> None:
    import numpy as np

    from matrixctl.formats.token_stream import TokenStreamWriter

    pub = str(keys) + ".pub"
    bad = tmp_path / "bad.mxt"
    with open(bad, "wb") as fp:
        w = TokenStreamWriter(fp, vocab_size=1 << 16)
        w.write(np.array([0x0300, *scx_golden.H_TOK, 0x0200, 0x0100, 0x7777], dtype=np.int64))
        w.close()
    res = run_cli(
        "tokenize",
        "scx",
        "decode",
        str(bad),
        "-o",
        str(tmp_path / "out"),
        "-r",
        str(signed),
        "--trust",
        pub,
    )
    assert res.code == 1
    assert "error[UNKNOWN_TOKEN]" in res.stderr and "token[35]" in res.stderr
    assert f"offset {16 + 8 + 35 * 2}" in res.stderr
    assert not (tmp_path / "out").exists()
    junk = run_cli("tokenize", "scx", "decode", "-r", str(signed), "--trust", pub, stdin=b"hello")
    assert junk.code == 1
    usage = run_cli("tokenize", "scx", "decode", "-r", str(signed), "--trust", pub, "--nope")
    assert usage.code == 2


def test_decode_lenient_flag(tmp_path: Path, signed: Path, keys: Path) -> None:
    import numpy as np

    from matrixctl.formats.token_stream import TokenStreamWriter

    raw_th = [0x0300, *scx_golden.H_TOK, 0x0200, 0x0100, ord("t"), ord("h"), 0x61, 0x61, 0x0101, 0x0201,  # noqa: E501
              0x0301, 4, 0, 0, 0, 0, 0, 0, 0]  # fmt: skip
    path = tmp_path / "nc.mxt"
    with open(path, "wb") as fp:
        w = TokenStreamWriter(fp, vocab_size=1 << 16)
        w.write(np.array(raw_th, dtype=np.int64))
        w.close()
    pub = str(keys) + ".pub"
    strict = run_cli("tokenize", "scx", "decode", str(path), "-r", str(signed), "--trust", pub)
    assert strict.code == 1 and "INVERTIBILITY_VIOLATION" in strict.stderr
    lenient = run_cli(
        "tokenize", "scx", "decode", str(path), "-r", str(signed), "--trust", pub, "--lenient"
    )
    assert lenient.code == 0 and lenient.stdout == b"thaa" and "warning" in lenient.stderr


def test_pack_shards_verify_and_rotate(tmp_path: Path, signed: Path, keys: Path) -> None:
    src = tmp_path / "blob.bin"
    src.write_bytes(bytes(range(256)) * 3)
    out = tmp_path / "pack"
    pub = str(keys) + ".pub"
    res = run_cli("pack", "shards", str(src), "-o", str(out), "-r", str(signed), "--trust", pub,
                  "--created-at", "2024-01-31T12:00:00Z", "--json")  # fmt: skip
    assert res.code == 0, res.stderr
    assert res.json()["shards"] == 96
    man = json.loads((out / "manifest.json").read_text())
    assert man["created_at"] == "2024-01-31T12:00:00Z"
    env = {"MATRIXCTL_SCX_TRUST": pub}
    ver = run_cli(
        "verify", "--json", str(out / "manifest.json"), str(out / "shard-000095.scxs"), env=env
    )
    assert ver.code == 0 and ver.json()["ok"], ver.out
    ins = run_cli("inspect", "--json", str(out / "manifest.json"), env=env)
    assert ins.code == 0 and ins.json()["files"][0]["h_manifest"] == man["manifest_hash"]
    again = run_cli("pack", "shards", str(src), "-o", str(out), "-r", str(signed), "--trust", pub)
    assert again.code == 2 and "OUT_EXISTS_DIR" in again.stderr
    # Rotation: a second key signs the manifest; H_TOK stays.
    k2 = tmp_path / "k2"
    assert run_cli("tokenize", "scx", "keygen", "-o", str(k2)).code == 0
    rot = run_cli(
        "tokenize",
        "scx",
        "sign",
        str(out / "manifest.json"),
        "-o",
        str(out / "manifest.json"),
        "--key",
        str(k2),
        "--json",
    )
    assert rot.code == 0, rot.stderr
    new = json.loads((out / "manifest.json").read_text())
    assert new["config_hash"] == man["config_hash"] and new["pi_key_id"] != man["pi_key_id"]
    assert new["key_history"][0]["pi_key_id"] == man["pi_key_id"]
    ok = run_cli(
        "verify", str(out / "manifest.json"), env={"MATRIXCTL_SCX_TRUST": str(k2) + ".pub"}
    )
    assert ok.code == 0, ok.stderr
    old_trust = run_cli("verify", str(out / "manifest.json"), env=env)
    assert old_trust.code == 1 and "UNSIGNED_REGISTRY" in old_trust.stderr


def test_pack_shards_errors(tmp_path: Path, signed: Path, keys: Path) -> None:
    pub = str(keys) + ".pub"
    res = run_cli("pack", "shards", "-o", str(tmp_path / "p"), "-r", str(signed), "--trust", pub,
                  "--strict-alignment", stdin=b"abc")  # fmt: skip
    assert res.code == 1 and "MISALIGNED_SHARD" in res.stderr
    assert not (tmp_path / "p").exists()
    res = run_cli(
        "pack",
        "shards",
        str(tmp_path / "missing"),
        "-o",
        str(tmp_path / "p"),
        "-r",
        str(signed),
        "--trust",
        pub,
    )
    assert res.code == 2 and "IO_NOT_FOUND" in res.stderr
    res = run_cli(
        "pack",
        "shards",
        "-o",
        str(tmp_path / "p"),
        "-r",
        str(signed),
        "--trust",
        pub,
        "--created-at",
        "yesterday",
    )
    assert res.code == 2


def test_verify_tampered_shard_exit_1(tmp_path: Path, signed: Path, keys: Path) -> None:
    src = tmp_path / "b.bin"
    src.write_bytes(b"x" * 40)
    out = tmp_path / "pack"
    pub = str(keys) + ".pub"
    assert (
        run_cli("pack", "shards", str(src), "-o", str(out), "-r", str(signed), "--trust", pub).code
        == 0
    )
    shard = out / "shard-000001.scxs"
    buf = bytearray(shard.read_bytes())
    buf[-3] ^= 1
    shard.write_bytes(bytes(buf))
    res = run_cli("verify", "--json", str(out / "manifest.json"), env={"MATRIXCTL_SCX_TRUST": pub})
    assert res.code == 1
    codes = {f["code"] for f in res.json()["files"][0]["findings"]}
    assert "SCX_SHARD_HASH" in codes


def test_help_does_not_import_heavy_modules() -> None:
    code = (
        "import sys\n"
        "from matrixctl.cli.app import main\n"
        "main(['tokenize', 'scx', 'encode', '--help'])\n"
        "main(['pack', 'shards', '--help'])\n"
        "bad = [m for m in ('numpy', 'cryptography', 'blake3', 'rich') if m in sys.modules]\n"
        "sys.stderr.write('HEAVY:' + ','.join(bad) + '\\n')\n"
    )
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "HEAVY:\n" in proc.stderr, proc.stderr
    assert "--registry" in proc.stdout


def test_scx_docs_are_generated() -> None:
    from matrixctl.cli import docgen

    cli_md = (docgen.ROOT / "docs/cli.md").read_text()
    errors_md = (docgen.ROOT / "docs/errors.md").read_text()
    for cmd in (
        "tokenize scx keygen",
        "tokenize scx sign",
        "tokenize scx encode",
        "tokenize scx decode",
        "pack shards",
    ):
        assert f"### `matrixctl {cmd}`" in cli_md, cmd
    for code in (
        "UNKNOWN_TOKEN",
        "UNSIGNED_REGISTRY",
        "SCX_MAN_HASH",
        "SCX_SHARD_HASH",
        "SCX_REG_FIXED",
    ):
        assert f"| `{code}` |" in errors_md, code
