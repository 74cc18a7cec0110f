"""`tokenize pi encode --jobs N`: the input cut into units where the tokens provably do not
depend on the cut (`Trie.cut`), encoded in N processes, with the bytes of one process
(docs/formats/pi-symbol-map.md, "Parallel encoding")."""

from __future__ import annotations

import json
import unicodedata
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies

from matrixctl import _pi_kernel
from matrixctl.errors import FormatError
from matrixctl.tokenizers import pi, pi_jobs
from matrixctl.tokenizing import encode_file
from tests.helpers.cli import run_cli
from tests.tokenizers.test_pi_kernel import BYTES, longest_match

# Cuts -----------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    words=strategies.lists(
        strategies.text("ab c", min_size=2, max_size=5), max_size=12, unique=True
    ),
    data=strategies.text("ab c", max_size=80),
    before=strategies.text("ab c", max_size=6),
    after=strategies.text("ab c", max_size=6),
)
def test_a_cut_splits_the_tiling_whatever_surrounds_the_bytes(
    words: list[str], data: str, before: str, after: str
) -> None:
    """Decision (pi-symbol-map.md, "Parallel encoding"): a position no pattern can span is a
    token boundary of any text that contains the bytes around it, so the two sides can be
    tokenized apart."""
    patterns = dict(BYTES)
    patterns.update({w.encode(): i for i, w in enumerate(words)})
    trie = _pi_kernel.Trie(list(patterns), list(patterns.values()))
    raw, pre, post = data.encode(), before.encode(), after.encode()
    whole = longest_match(patterns, pre + raw + post)
    for p in range(len(raw) + 1):
        if trie.cut(raw, p, p + 1) != p:
            continue
        assert p >= trie.lookahead - 1  # every walk that could span p starts inside the bytes
        left = longest_match(patterns, pre + raw[:p])
        assert left + longest_match(patterns, raw[p:] + post) == whole


def test_no_cut_where_every_position_is_spanned() -> None:
    patterns = {**BYTES, b"aa": 1}
    trie = _pi_kernel.Trie(list(patterns), list(patterns.values()))
    assert trie.cut(b"a" * 50, 0, 50) == -1
    assert trie.cut(b"a" * 50 + b"b" * 5, 0, 55) == 50  # "ab" is no pattern: after the a's


def test_normalize_runs_keeps_an_already_normalized_text() -> None:
    text = "caf\u00e9 " * 20
    nfkc = partial(unicodedata.normalize, "NFKC")
    assert _pi_kernel.normalize_runs(text, 4, nfkc) is text
    assert _pi_kernel.normalize_runs("a\u00a0b\ufb01", 4, nfkc) == "a b" + "fi"


# Whole documents ------------------------------------------------------------------------------


@pytest.fixture
def tiny_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Units of ~600 bytes, so a small text makes many (the forked workers inherit these)."""
    monkeypatch.setattr(pi_jobs, "UNIT", 600)
    monkeypatch.setattr(pi_jobs, "MAX_SCAN", 200)
    monkeypatch.setattr(pi_jobs, "WINDOW", 300)
    monkeypatch.setattr(pi_jobs, "NEAR", 150)


SENTENCEPIECE = {
    "version": 1,
    "vocab_size": 300,
    "unk_id": 0,
    "pad_id": 0,
    "eos_id": 1,
    "byte_fallback": True,
    "byte_base_id": 10,
    "normalization": "nfkc",
    "space_marking": {"scheme": "sentencepiece", "marker": "\u2581", "prefix_space": True},
    "symbols": [
        {"id": 2, "text": "\u2581the"},
        {"id": 3, "text": "\u2581a"},
        {"id": 4, "text": "ing\u2581"},
        {"id": 5, "text": "fi"},
        {"id": 6, "text": "\u00e9t\u00e9"},
        {"id": 7, "text": "\u4e2d\u6587"},
    ],
}

TEXTS = {
    "english": "the thing is a fine thing\n" * 200,
    "mixed": ("Caf\u00e9\u00a0cr\u00e8me, \ufb01ne \u2163 e\u0301t\u00e9 \u4e2d\u6587 " * 80),
    "bom": "\ufeffthe bom starts it\n" * 100,
    "no ascii": "\u4e2d\u6587\u5b57\u00e9\u00e8" * 400,  # cuts before CJK characters only
    "cyrillic": "\u043f\u0440\u0438\u0432\u0435\u0442" * 300,  # no cut point: one unit
    "empty": "",
}


def _encode(path: str, out: Path, jobs: int, symbols: str | None) -> bytes:
    encode_file(path, str(out), symbols=symbols, label="doc", jobs=jobs)
    return out.read_bytes()


@pytest.mark.parametrize("name", sorted(TEXTS))
@pytest.mark.parametrize("marking", [False, True])
def test_jobs_write_the_bytes_of_one_process(
    tmp_path: Path, tiny_units: None, name: str, marking: bool
) -> None:
    src = tmp_path / "in.txt"
    src.write_bytes(TEXTS[name].encode())
    symbols = None
    if marking:
        symbols = str(tmp_path / "map.json")
        Path(symbols).write_text(json.dumps(SENTENCEPIECE))
    one = _encode(str(src), tmp_path / "one.mxt", 1, symbols)
    for jobs in (2, 3):
        assert _encode(str(src), tmp_path / f"{jobs}.mxt", jobs, symbols) == one


@pytest.mark.parametrize("name", ["english", "mixed", "no ascii", "empty"])
def test_jobs_on_a_pipe_write_the_bytes_of_one_process(
    tmp_path: Path, tiny_units: None, name: str
) -> None:
    data = TEXTS[name].encode()
    one = run_cli("tokenize", "pi", "encode", "-q", stdin=data)
    two = run_cli("tokenize", "pi", "encode", "-q", "-j", "2", stdin=data)
    assert one.code == two.code == 0
    assert two.stdout == one.stdout


def test_jobs_on_a_pipe_with_units_larger_than_a_pipe_buffer() -> None:
    """Units of 1 MB that carry their bytes (a pipe's input) and results larger than a pipe
    buffer: the main process takes a worker's result before it sends the worker more, and
    tokenizes its own share meanwhile; the bytes of one process, no deadlock."""
    from tests.helpers.cli import run_sub

    data = TEXTS["mixed"].encode() * 700  # ~3.5 MB: four units
    one = run_sub("tokenize", "pi", "encode", "-q", stdin=data, timeout=60)
    for jobs in ("2", "3"):
        many = run_sub("tokenize", "pi", "encode", "-q", "-j", jobs, stdin=data, timeout=60)
        assert one.code == many.code == 0
        assert many.stdout == one.stdout


@pytest.mark.parametrize("slow", [0, 1, 4])
def test_results_are_taken_as_they_come_and_yielded_in_order(
    tmp_path: Path, tiny_units: None, monkeypatch: pytest.MonkeyPatch, slow: int
) -> None:
    """Decision (tok18jobs, pi_jobs): the workers tokenize every unit and the main process
    reads their results as they come, keeping those whose turn has not come. The worker that
    has unit `slow` holds it until the main process has read more than DEPTH results of the
    other worker (the forked workers inherit the patched `_run`): read in input order only,
    they would never come, and the run would wait 30 s for nothing. The ids are yielded in
    input order: the bytes of one process."""
    import os
    import time

    src = tmp_path / "in.txt"
    src.write_bytes(TEXTS["mixed"].encode() * 5)
    one = _encode(str(src), tmp_path / "one.mxt", 1, None)
    fd = os.open(src, os.O_RDONLY)
    try:
        slow_offset = list(pi_jobs._file_units(fd, 0, src.stat().st_size))[slow][0]
    finally:
        os.close(fd)
    mark, go = tmp_path / "slow", tmp_path / "go"
    run = pi_jobs._run

    def slow_run(tok: object, fd: int, start: int, unit: pi_jobs.Unit) -> tuple[object, ...]:
        if unit[0] == slow_offset:
            (tmp_path / "slow.tmp").write_text(str(os.getpid()))
            (tmp_path / "slow.tmp").rename(mark)
            deadline = time.monotonic() + 30
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        return run(tok, fd, start, unit)  # type: ignore[arg-type]

    others: list[int] = []
    receive = pi_jobs._Workers.receive

    def counted(self: pi_jobs._Workers, worker: int) -> tuple[tuple[object, ...], object]:
        got = receive(self, worker)
        if mark.exists() and int(mark.read_text()) != self.procs[worker][0]:
            others.append(worker)
            if len(others) > pi_jobs.DEPTH:
                go.touch()
        return got

    monkeypatch.setattr(pi_jobs, "_run", slow_run)
    monkeypatch.setattr(pi_jobs._Workers, "receive", counted)
    assert _encode(str(src), tmp_path / "two.mxt", 2, None) == one
    assert go.exists()


@pytest.mark.parametrize("pipe", [False, True])
def test_a_worker_that_dies_is_an_error_and_no_output(
    tmp_path: Path, tiny_units: None, monkeypatch: pytest.MonkeyPatch, pipe: bool
) -> None:
    """A worker that dies on a unit (killed, out of memory) is one error naming it, for a file
    (the workers read it) and for a stream (the units carry their bytes); no output is left
    and no worker outlives the run."""
    import io
    import os

    run = pi_jobs._run

    def dying(tok: object, fd: int, start: int, unit: pi_jobs.Unit) -> tuple[object, ...]:
        if unit[0] > 0:
            os._exit(9)
        return run(tok, fd, start, unit)  # type: ignore[arg-type]

    monkeypatch.setattr(pi_jobs, "_run", dying)
    data = TEXTS["english"].encode()
    src = tmp_path / "in.txt"
    src.write_bytes(data)
    before = set(_children(os.getpid()))
    tok = pi.Tokenizer(pi.load_symbol_map(pi.default_map_path())[0])
    with pytest.raises(RuntimeError, match=r"encoding worker [12] ended"):
        if pipe:
            parts = pi_jobs.encode(tok, io.BytesIO(data), "<stdin>", 2)
        else:
            fd = os.open(src, os.O_RDONLY)
            parts = pi_jobs.encode(tok, None, str(src), 2, fd=fd)
        try:
            list(parts)
        finally:
            parts.close()
            if not pipe:
                os.close(fd)
    assert set(_children(os.getpid())) <= before
    with pytest.raises(RuntimeError, match="encoding worker"):
        _encode(str(src), tmp_path / "out.mxt", 2, None)
    assert not (tmp_path / "out.mxt").exists()


def test_no_more_workers_than_units(
    tmp_path: Path, tiny_units: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--jobs 16` on an input of a few units forks a worker per unit, no more (each worker
    gets a unit as it is forked), and writes the bytes of one process."""
    import os

    forks: list[int] = []
    fork = pi_jobs._Workers.fork

    def counted(self: pi_jobs._Workers) -> None:
        forks.append(1)
        fork(self)

    monkeypatch.setattr(pi_jobs._Workers, "fork", counted)
    src = tmp_path / "in.txt"
    src.write_bytes(TEXTS["english"].encode())
    fd = os.open(src, os.O_RDONLY)
    try:
        units = len(list(pi_jobs._file_units(fd, 0, src.stat().st_size)))
    finally:
        os.close(fd)
    assert 2 < units < 16
    one = _encode(str(src), tmp_path / "one.mxt", 1, None)
    assert _encode(str(src), tmp_path / "many.mxt", 16, None) == one
    assert len(forks) == units


def test_workers_are_reaped_after_the_commit(
    tmp_path: Path, tiny_units: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decision (tok18jobs, pi_jobs.Encoding): once the last result is read the workers are
    told to exit (their task pipes closed), and they are reaped only after the output is
    committed, so their exit overlaps with the commit; none is left after the run."""
    import os

    from matrixctl import io as mio

    order: list[str] = []
    for cls, name in ((mio.AtomicFile, "commit"), (pi_jobs._Workers, "release")):
        orig = getattr(cls, name)

        def logged(self: object, *a: object, _orig: object = orig, _name: str = name) -> object:
            order.append(_name)
            return _orig(self, *a)  # type: ignore[operator]

        monkeypatch.setattr(cls, name, logged)
    close = pi_jobs._Workers.close

    def logged_close(self: pi_jobs._Workers, *, kill: bool) -> None:
        order.append("reap" if self.procs else "closed")
        close(self, kill=kill)

    monkeypatch.setattr(pi_jobs._Workers, "close", logged_close)
    src = tmp_path / "in.txt"
    src.write_bytes(TEXTS["english"].encode())
    before = set(_children(os.getpid()))
    one = _encode(str(src), tmp_path / "one.mxt", 1, None)
    order.clear()
    assert _encode(str(src), tmp_path / "two.mxt", 2, None) == one
    assert order[:3] == ["release", "commit", "reap"]
    assert set(_children(os.getpid())) <= before


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_an_output_that_cannot_be_opened_stops_the_started_workers(
    tmp_path: Path, tiny_units: None
) -> None:
    """Decision (tokenizing.encode_file): the workers start before the output is opened; an
    output that cannot be opened is its one error, and the workers are gone with it."""
    import os

    from matrixctl.errors import MatrixError

    src = tmp_path / "in.txt"
    src.write_bytes(TEXTS["english"].encode())
    before = set(_children(os.getpid()))  # other tests' helpers (a Dask cluster) may live on
    with pytest.raises(MatrixError) as info:
        _encode(str(src), tmp_path / "no" / "such" / "out.mxt", 2, None)
    assert info.value.exit_code == 2
    assert set(_children(os.getpid())) <= before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_file_ends_in_smaller_units(tmp_path: Path, tiny_units: None) -> None:
    """Decision (pi_jobs.TAIL): a file's last bytes are cut into quarter units, so the
    processes finish within a small unit of each other; the units tile the file."""
    import os

    src = tmp_path / "in.txt"
    src.write_bytes(TEXTS["english"].encode())  # 5,200 bytes: units of 600, then of 400
    fd = os.open(src, os.O_RDONLY)
    try:
        units = list(pi_jobs._file_units(fd, 0, src.stat().st_size))
    finally:
        os.close(fd)
    assert [u[0] for u in units[1:]] == [u[0] + u[1] for u in units[:-1]]
    assert units[-1][0] + units[-1][1] == src.stat().st_size
    head = [u[1] for u in units if u[0] + pi_jobs.TAIL * pi_jobs.UNIT < src.stat().st_size]
    tail = [u[1] for u in units if u[0] + pi_jobs.TAIL * pi_jobs.UNIT >= src.stat().st_size]
    assert head and all(550 < n <= 600 for n in head)
    assert len(tail) > pi_jobs.TAIL and all(n <= 400 for n in tail)


@pytest.mark.parametrize("where", [5, 599, 600, 601, 1801, -1])
def test_invalid_utf8_is_reported_as_one_process_reports_it(
    tmp_path: Path, tiny_units: None, where: int
) -> None:
    data = bytearray(TEXTS["english"].encode())
    data[where] = 0xE2  # a lead byte followed by ASCII: invalid continuation byte
    if where == -1:
        data[-1:] = b"\xe2\x96"  # cut short at the end
    src = tmp_path / "bad.txt"
    src.write_bytes(bytes(data))
    errors = []
    for jobs in (1, 2):
        with pytest.raises(FormatError) as info:
            _encode(str(src), tmp_path / "out.mxt", jobs, None)
        errors.append((info.value.code, info.value.offset, info.value.message))
        assert not (tmp_path / "out.mxt").exists()
    assert errors[0] == errors[1]
    assert errors[0][0] == "PI_TEXT_UTF8"


def test_a_one_unit_input_is_encoded_without_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_fork(*args: object) -> None:
        raise AssertionError("forked for a one-line input")

    monkeypatch.setattr(pi_jobs._Workers, "fork", no_fork)
    src = tmp_path / "line.txt"
    src.write_bytes(b"one line\n")
    assert _encode(str(src), tmp_path / "a.mxt", 4, None) == _encode(
        str(src), tmp_path / "b.mxt", 1, None
    )


def test_cli_jobs_option(tmp_path: Path, tiny_units: None) -> None:
    src = tmp_path / "in.txt"
    src.write_bytes(TEXTS["mixed"].encode())
    one = run_cli("tokenize", "pi", "encode", str(src), "--ids", "-q")
    two = run_cli("tokenize", "pi", "encode", str(src), "--ids", "-q", "--jobs", "2")
    assert one.code == two.code == 0 and two.stdout == one.stdout
    js = run_cli("tokenize", "pi", "encode", str(src), "--json", "-j", "2")
    assert js.code == 0 and json.loads(js.out)["ids"] == [int(x) for x in one.out.split()]
    bad = run_cli("tokenize", "pi", "encode", str(src), "-j", "0")
    assert bad.code == 2 and "USAGE" in bad.stderr and "--jobs" in bad.stderr


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fp:
            return [int(c) for c in fp.read().split()]
    except OSError:
        return []


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_sigterm_during_jobs_leaves_no_output_and_no_worker(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers.cli import ROOT

    src = tmp_path / "in.txt"
    src.write_bytes(TEXTS["english"].encode() * 2000)  # ~10 MB: ten units
    out = tmp_path / "out.mxt"
    code = (
        "import sys; from matrixctl.tokenizers import pi_jobs; pi_jobs.UNIT = 1 << 16; "
        "from matrixctl.cli.entry import main; raise SystemExit(main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "tokenize",
            "pi",
            "encode",
            "-j",
            "2",
            str(src),
            "-o",
            str(out),
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    workers: list[int] = []
    deadline = time.monotonic() + 30
    while not workers and proc.poll() is None and time.monotonic() < deadline:
        workers = _children(proc.pid)
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if not workers:
        pytest.skip("the command ended before its workers could be seen")
    assert proc.returncode == 130, err
    assert b"interrupted" in err and b"Traceback" not in err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["in.txt"]  # no temporary file either
    for pid in workers:  # reaped by the command: gone, not zombies
        assert not os.path.exists(f"/proc/{pid}")
