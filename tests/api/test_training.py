"""`matrixctl.torch_dataset`: workers x ranks exactly once, an order that does not depend on
them, StatefulDataLoader resume (same and changed worker counts), pickling, spawn workers."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies

import matrixctl
from matrixctl.errors import FormatError
from matrixctl.training import merge_states
from tests.helpers.cli import FIXTURES, ROOT, run_cli

BATCH = 2


@pytest.fixture(autouse=True, scope="module")
def _torch() -> None:
    """torch is imported by the tests that use it, not at collection: tests/api/test_api.py
    checks that reading a pack imports no torch, in the same process."""
    pytest.importorskip("torch")


def DataLoader(*args: object, **kwargs: object) -> Any:
    from torch.utils.data import DataLoader as loader_class

    return loader_class(*args, **kwargs)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("training") / "pack"
    res = run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", str(out), "--atom-size", "8")
    assert res.code == 0, res.stderr
    return out


def _atoms(pack: Path) -> np.ndarray:
    return matrixctl.open_pack(pack)[:]


def _steps(per_rank: list[list[list[list[int]]]]) -> list[list[int]]:
    """The atoms of each step over every rank, rank 0's batch first."""
    steps = max(len(b) for b in per_rank)
    out = []
    for t in range(steps):
        rows: list[list[int]] = []
        for batches in per_rank:
            if t < len(batches):
                rows.extend(batches[t])
        out.append(rows)
    return out


def _run(pack: Path, workers: int, world: int, **kw: object) -> list[list[list[list[int]]]]:
    per_rank = []
    for rank in range(world):
        ds = matrixctl.torch_dataset(
            pack, seed=3, dtype="int64", rank=rank, world_size=world, batch_size=BATCH, **kw
        )
        loader = DataLoader(ds, batch_size=BATCH, num_workers=workers)
        per_rank.append([b.tolist() for b in loader])
    return per_rank


def test_every_atom_once_in_the_same_global_order_whatever_the_workers_and_ranks(
    pack: Path,
) -> None:
    atoms = _atoms(pack)
    order = matrixctl.open_pack(pack).order(0, seed=3)
    want = atoms[order].tolist()
    for workers, world in ((0, 1), (2, 1), (1, 2), (2, 2), (3, 1)):
        steps = _steps(_run(pack, workers, world))
        flat = [row for step in steps for row in step]
        assert sorted(flat) == sorted(atoms.tolist()), (workers, world)  # exactly once
        if len(atoms) % (BATCH * world * max(workers, 1)) == 0:
            assert flat == want, (workers, world)  # the global order itself
        else:
            # Step t's atoms are the order's t-th global batch while every consumer has a
            # whole batch; only the tail of the epoch is dealt unevenly.
            full = len(atoms) // (BATCH * world * max(workers, 1)) * max(workers, 1)
            assert flat[: full * BATCH * world] == want[: full * BATCH * world], (workers, world)


def test_exactly_once_across_two_workers_and_two_gloo_ranks(pack: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.ddp_ranks",
                str(pack),
                str(tmp_path / f"r{r}"),
                str(r),
                "2",
                port,
            ],
            cwd=ROOT,
            env=env,
            stderr=subprocess.PIPE,
        )
        for r in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
    per_rank = [json.loads((tmp_path / f"r{r}").read_text()) for r in range(2)]
    flat = [row for batches in per_rank for b in batches for row in b]
    atoms = _atoms(pack).tolist()
    assert sorted(flat) == sorted(atoms) and len(flat) == len(atoms)
    assert per_rank == _run(pack, 2, 2)  # the same shares as ranks given by hand


def test_pickled_size_is_small_whatever_the_pack(pack: Path) -> None:
    ds = matrixctl.torch_dataset(pack, dtype="int64")
    blob = pickle.dumps(ds)
    assert len(blob) < 1024 and b"matrix_atoms" not in blob
    back = pickle.loads(blob)
    assert [a.tolist() for a in back] == [a.tolist() for a in ds]
    assert len(pickle.dumps(matrixctl.open_pack(pack))) < 1024


def _stateful(ds: object, workers: int) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers)


def test_stateful_dataloader_resumes_mid_epoch_with_the_same_batches(pack: Path) -> None:
    pytest.importorskip("torchdata")

    def make() -> Any:
        return matrixctl.torch_dataset(pack, seed=5, dtype="int64", batch_size=BATCH)

    whole = [b.tolist() for b in _stateful(make(), 2)]
    loader = _stateful(make(), 2)
    first = []
    for b in loader:
        first.append(b.tolist())
        if len(first) == 5:
            saved = json.dumps(loader.state_dict())  # JSON-able, beside the checkpoint
            break
    resumed = _stateful(make(), 2)
    resumed.load_state_dict(json.loads(saved))
    rest = [b.tolist() for b in resumed]
    assert first + rest == whole
    # ...and in a new process, as after a crash: the state file is all it gets.
    state_file = pack.parent / "loader-state.json"
    state_file.write_text(saved)
    script = (
        "import json, sys\n"
        "from torchdata.stateful_dataloader import StatefulDataLoader\n"
        "import matrixctl\n"
        "ds = matrixctl.torch_dataset(sys.argv[1], seed=5, dtype='int64', batch_size=2)\n"
        "loader = StatefulDataLoader(ds, batch_size=2, num_workers=2)\n"
        "loader.load_state_dict(json.load(open(sys.argv[2])))\n"
        "print(json.dumps([b.tolist() for b in loader]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(pack), str(state_file)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert first + json.loads(out.stdout) == whole


def test_resume_with_another_number_of_ranks(pack: Path) -> None:
    """Two ranks of one worker stop mid-epoch; one rank of two workers finishes the epoch."""
    pytest.importorskip("torchdata")
    atoms = _atoms(pack).tolist()
    states, first = [], []
    for rank in range(2):
        ds = matrixctl.torch_dataset(pack, seed=8, rank=rank, world_size=2, batch_size=BATCH)
        loader = _stateful(ds, 1)
        for step, b in enumerate(loader):
            first.extend(b.tolist())
            if step == 2 - rank:  # the ranks stopped at different steps
                states.append(json.loads(json.dumps(loader.state_dict())))
                break
    state = merge_states(*states)
    ds = matrixctl.torch_dataset(pack, seed=8, batch_size=BATCH)
    ds.load_state_dict(state)
    rest = [row for b in _stateful(ds, 2) for row in b.tolist()]
    assert sorted(first + rest) == sorted(atoms)


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1), (2, 0)])
def test_resume_with_another_worker_count_neither_repeats_nor_skips(
    pack: Path, before: int, after: int
) -> None:
    pytest.importorskip("torchdata")
    atoms = _atoms(pack).tolist()
    loader = _stateful(matrixctl.torch_dataset(pack, seed=9, batch_size=BATCH), before)
    first = []
    for b in loader:
        first.extend(b.tolist())
        if len(first) >= 9:
            state = merge_states(json.loads(json.dumps(loader.state_dict())))
            break
    ds = matrixctl.torch_dataset(pack, seed=9, batch_size=BATCH)
    ds.load_state_dict(state)
    rest = [row for b in _stateful(ds, after) for row in b.tolist()]
    assert sorted(first + rest) == sorted(atoms)  # nothing repeated, nothing skipped
    order = matrixctl.open_pack(pack).order(0, seed=9)
    done = set(state["done"])
    left = [atoms[int(order[p])] for p in range(state["position"], len(atoms)) if p not in done]
    assert rest[: BATCH * max(after, 1)] == left[: BATCH * max(after, 1)]  # the same order on


def test_states_of_another_configuration_are_refused(pack: Path) -> None:
    ds = matrixctl.torch_dataset(pack, seed=1, batch_size=BATCH)
    with pytest.raises(FormatError) as err:
        ds.load_state_dict({"kind": "matrixctl.torch_dataset", "epoch": 0})
    assert err.value.code == "PACK_STATE"
    state = matrixctl.torch_dataset(pack, seed=2).state_dict()
    with pytest.raises(FormatError, match="seed"):
        ds.load_state_dict(state)
    with pytest.raises(FormatError, match="consumers"):
        merge_states({"kind": "matrixctl.torch_dataset", **{**state, "consumers": 2}})
    ds.load_state_dict({**state, "seed": 1, "consumers": 2, "consumer": 1, "yielded": 2})
    with pytest.raises(FormatError) as err2:
        list(ds)  # consumer 1 of 2 asked of a lone process
    assert err2.value.code == "PACK_STATE"


def test_epochs_differ_and_set_epoch_restarts(pack: Path) -> None:
    ds = matrixctl.torch_dataset(pack, seed=4)
    e0 = [a.tolist() for a in ds]
    assert [a.tolist() for a in ds] == e0  # iterating again: the same epoch
    ds.set_epoch(1)
    e1 = [a.tolist() for a in ds]
    assert e1 != e0 and sorted(e1) == sorted(e0)


def test_spawn_workers_map_the_pack_instead_of_copying_it(pack: Path, tmp_path: Path) -> None:
    """A spawn worker's anonymous memory is the same over a 6 MB pack as over a tiny one: the
    atoms it reads are file pages of one shared mapping (RssFile), not a pickled copy
    (RssAnon)."""
    corpus = tmp_path / "big.jsonl"
    with corpus.open("w") as fp:
        for i in range(6000):
            fp.write(
                json.dumps({"text": f"document {i} " + "lorem ipsum dolor sit amet " * 60}) + "\n"
            )
    big = tmp_path / "big"
    res = run_cli("ingest", "docs", str(corpus), "-o", str(big), "--atom-size", "512")
    assert res.code == 0, res.stderr
    payload = (big / "matrix_atoms.bin").stat().st_size
    assert payload > 4 << 20
    script = tmp_path / "rss.py"
    probe = (
        "import sys, matrixctl\n"
        "from torch.utils.data import DataLoader, get_worker_info\n"
        "def status(key):\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith(key):\n"
        "            return int(line.split()[1]) * 1024\n"
        "def report(batch):\n"
        "    return [status('RssAnon:'), status('RssFile:')]\n"
        "if __name__ == '__main__':\n"
        "    ds = matrixctl.torch_dataset(sys.argv[1], batch_size=64)\n"
        "    loader = DataLoader(ds, batch_size=64, num_workers=1,\n"
        "                        multiprocessing_context='spawn', collate_fn=report)\n"
        "    seen = list(loader)\n"
        "    print(seen[0][0], seen[-1][0], seen[-1][1])\n"
    )
    script.write_text(probe)
    seen = {}
    for name, where in (("tiny", pack), ("big", big)):
        out = subprocess.run(
            [sys.executable, str(script), str(where)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        seen[name] = list(map(int, out.stdout.split()))
    anon_tiny, anon_big, file_big = seen["tiny"][1], seen["big"][1], seen["big"][2]
    assert anon_big - anon_tiny < payload // 2  # no copy of the payload in anonymous memory
    assert file_big - seen["tiny"][2] > payload // 2  # read through the shared file mapping


@settings(max_examples=200, deadline=None)
@given(
    count=strategies.integers(0, 60),
    before=strategies.integers(1, 5),
    after=strategies.integers(1, 5),
    chunk=strategies.integers(1, 4),
    data=strategies.data(),
)
def test_merged_states_deal_the_rest_exactly_once(
    count: int, before: int, after: int, chunk: int, data: strategies.DataObject
) -> None:
    """Without torch: consumers stop anywhere in their shares; the merged state dealt to another
    number of consumers covers every position not yet yielded, once, twice over (two stops)."""
    from matrixctl.training import KIND, share

    cut: dict[str, object] = {"position": 0, "done": []}
    seen: list[int] = []
    for consumers in (before, after, 1):
        shares = [share(count, cut, c, consumers, chunk).tolist() for c in range(consumers)]
        if consumers == 1:  # the last run finishes the epoch
            seen += shares[0]
            break
        states = []
        for c, mine in enumerate(shares):
            m = data.draw(strategies.integers(0, len(mine)))
            seen += mine[:m]
            states.append(
                {"kind": KIND, "epoch": 0, "seed": 0, "shuffle": True, **cut,
                 "consumer": c, "consumers": consumers, "batch_size": chunk, "yielded": m}
            )  # fmt: skip
        merged = merge_states(*states)
        cut = {"position": merged["position"], "done": merged["done"]}
    assert sorted(seen) == list(range(count))
