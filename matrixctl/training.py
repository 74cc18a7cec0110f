"""An ingest pack as a PyTorch `IterableDataset`: DataLoader workers, distributed ranks, exact
and elastic resume (`matrixctl.torch_dataset`; docs/training.md).

    ds = matrixctl.torch_dataset("pack/", seed=0, dtype="int64", batch_size=8)
    loader = torchdata.stateful_dataloader.StatefulDataLoader(ds, batch_size=8, num_workers=2)
    for epoch in range(3):
        ds.set_epoch(epoch)
        for batch in loader: ...

The work is cut like this. Epoch `e` has one global order, `PackDataset.order(e, seed=seed)`, the
same whatever runs it. Its positions are dealt in chunks of `batch_size` atoms to the
`world_size x num_workers` consumers in turn: chunk `k` goes to consumer `k mod C`, consumer
`worker * world_size + rank`. A DataLoader asks its workers for batches in turn, so with the
DataLoader's batch size equal to `batch_size`, the batches of step `t` over every rank are
exactly the global order's atoms `t*B .. (t+1)*B` (B = batch_size x world_size), whatever the
number of workers. Every atom is in exactly one consumer's share: exactly once per epoch.

State. A consumer's `state_dict()` is a small JSON-able dict: the epoch, seed and shuffle, the
cut (`position` and `done`, below), its place among the consumers and how many atoms it has
yielded. torchdata's `StatefulDataLoader` saves one per worker and gives each back to its worker
on `load_state_dict`: the same batches follow. To resume with another number of workers or ranks
(elastic), `merge_states(...)` takes every consumer's state (the loader state dicts of all
ranks, or the consumers' own) and returns the global state: `position`, the first position of
the epoch's order not yet yielded by anyone, and `done`, the few positions after it that some
consumer already yielded (at most a batch or two per consumer). Loaded into a new dataset, that
remainder is dealt afresh to however many consumers there now are.

The dataset pickles by path and by its settings (under 1 KB), never by payload: each worker maps
the pack itself, so a `spawn` or `forkserver` worker shares the page cache rather than holding a
copy (`PackDataset.__reduce__`).

torch is imported when this module is (the module itself is imported only when
`matrixctl.torch_dataset` is first used); without it `torch_dataset` raises a UsageError that
names the `torch` extra.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from matrixctl.dataset import PACK_STATE, PackDataset
from matrixctl.errors import FormatError, UsageError

if TYPE_CHECKING:
    import numpy as np

KIND = "matrixctl.torch_dataset"  # marks a consumer's state inside a loader's state dict
GATHER = 256  # atoms read per gather (one np.take) while iterating


def torch_dataset(
    pack_or_path: PackDataset | str | os.PathLike[str],
    *,
    seed: int = 0,
    shuffle: bool = True,
    dtype: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
    batch_size: int = 1,
) -> Any:
    """A `torch.utils.data.IterableDataset` of the pack's atoms (see the module docstring).

    `rank` and `world_size` default to torch.distributed's when a process group is
    initialized (create the dataset after `init_process_group`), else 0 and 1. `dtype` is the
    id dtype of the atoms yielded (e.g. "int64"); `batch_size` the chunk dealt to a consumer at a
    time: pass the DataLoader's batch size so that each step's global batch is a fixed slice of
    the epoch's order."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError(
            "torch_dataset needs PyTorch, which is not installed",
            hint="pip install 'matrixctl[torch]'",
        ) from None
    path = pack_or_path.path if isinstance(pack_or_path, PackDataset) else os.fspath(pack_or_path)
    if dtype is None and isinstance(pack_or_path, PackDataset) and pack_or_path.out_dtype:
        dtype = pack_or_path.out_dtype.name
    for name, value in (("seed", seed), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (name == "batch_size"):
            raise UsageError(f"{name} must be an int >= {int(name == 'batch_size')}, got {value!r}")
    rank, world_size = _ranks(rank, world_size)
    dtype = None if dtype is None else _dtype_name(dtype)
    # Opened here once: a bad path or pack fails at this call, not in a worker, and the modules
    # opening needs are imported before a fork (a worker then opens the pack in about a ms).
    pack = pack_or_path if isinstance(pack_or_path, PackDataset) else PackDataset(path, dtype=dtype)
    cls = _dataset_class()
    ds = cls(
        {
            "path": path,
            "seed": seed,
            "shuffle": bool(shuffle),
            "dtype": dtype,
            "rank": rank,
            "world_size": world_size,
            "batch_size": batch_size,
        }
    )
    if (None if pack.out_dtype is None else pack.out_dtype.name) == dtype:
        ds._impl._pack = pack  # the same reads: used in this process, never pickled
    return ds


def _dtype_name(dtype: Any) -> str:
    import numpy as np

    try:
        return np.dtype(dtype).name
    except TypeError:
        raise UsageError(f"dtype {dtype!r} is not a numpy dtype") from None


def _ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    for name, value in (("rank", rank), ("world_size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise UsageError(f"{name} must be an int, got {value!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in 0..world_size-1 (world_size {world_size})")
    return rank, world_size


_CLASS: list[type] = []


def _dataset_class() -> type:
    """The IterableDataset subclass, made on first use (torch is imported only then)."""
    if _CLASS:
        return _CLASS[0]
    from torch.utils.data import IterableDataset

    class TorchPackDataset(IterableDataset):
        __doc__ = _Consumer.__doc__

        def __init__(self, config: dict[str, Any]) -> None:
            self._impl = _Consumer(config)

        def __iter__(self) -> Iterator[Any]:
            return self._impl.iterate()

        def set_epoch(self, epoch: int) -> None:
            """The epoch the next iteration runs (a fresh start of that epoch)."""
            self._impl.set_epoch(epoch)

        def state_dict(self) -> dict[str, Any]:
            return self._impl.state_dict()

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self._impl.load_state_dict(state)

        @property
        def pack(self) -> PackDataset:
            return self._impl.pack

        def __reduce__(self) -> tuple[Any, ...]:
            return (_rebuild, (self._impl.picklable(),))

        def __repr__(self) -> str:
            c = self._impl.config
            return (
                f"<TorchPackDataset {c['path']!r} seed={c['seed']} rank={c['rank']}/"
                f"{c['world_size']} batch_size={c['batch_size']}>"
            )

    TorchPackDataset.__module__ = __name__
    _CLASS.append(TorchPackDataset)
    return TorchPackDataset


def _rebuild(state: dict[str, Any]) -> Any:
    """Unpickling (in a DataLoader worker): the same settings and state, the pack mapped again."""
    ds = _dataset_class()(state["config"])
    ds._impl.restore(state)
    return ds


class _Consumer:
    """One consumer's share of each epoch (see the module docstring); torch-free."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._pack: PackDataset | None = None
        self.epoch = 0
        self.cut: dict[str, Any] = {"position": 0, "done": []}  # where this epoch's deal starts
        self.resume: dict[str, Any] | None = None  # a consumer state to continue from
        self.yielded = 0
        self.who: tuple[int, int] | None = None  # (consumer, consumers) of the last iteration

    @property
    def pack(self) -> PackDataset:
        if self._pack is None:
            self._pack = PackDataset(self.config["path"], dtype=self.config["dtype"])
        return self._pack

    def picklable(self) -> dict[str, Any]:
        return {"config": self.config, "epoch": self.epoch, "cut": self.cut, "resume": self.resume}

    def restore(self, state: dict[str, Any]) -> None:
        self.epoch, self.cut, self.resume = state["epoch"], state["cut"], state["resume"]

    def set_epoch(self, epoch: int) -> None:
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise UsageError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch, self.cut, self.resume, self.yielded = (
            epoch,
            {"position": 0, "done": []},
            None,
            0,
        )

    def consumer(self) -> tuple[int, int]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        c = self.config
        # Worker-major: step t's batches over the ranks are then chunks t*R .. t*R + R - 1.
        return worker * c["world_size"] + c["rank"], c["world_size"] * workers

    # State -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        consumer, consumers = self.who if self.who is not None else self.consumer()
        if self.resume is not None and self.who is None:
            return dict(self.resume)
        c = self.config
        return {
            "kind": KIND,
            "epoch": self.epoch,
            "seed": c["seed"],
            "shuffle": c["shuffle"],
            "position": self.cut["position"],
            "done": list(self.cut["done"]),
            "consumer": consumer,
            "consumers": consumers,
            "batch_size": c["batch_size"],
            "yielded": self.yielded,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = _checked(state, len(self.pack))
        c = self.config
        for key in ("seed", "shuffle"):
            if state[key] != c[key]:
                raise FormatError(
                    PACK_STATE,
                    f"the state was saved with {key}={state[key]!r}, this dataset has "
                    f"{c[key]!r}: it would not continue the same order",
                    field=key,
                )
        self.epoch = state["epoch"]
        self.cut = {"position": state["position"], "done": list(state["done"])}
        self.yielded = 0
        self.who = None
        self.resume = state if "consumer" in state else None

    # Iteration -------------------------------------------------------------------------------

    def iterate(self) -> Iterator[np.ndarray]:
        consumer, consumers = self.consumer()
        c = self.config
        start = 0
        if self.resume is not None:
            r = self.resume
            if (r["consumer"], r["consumers"], r["batch_size"]) != (
                consumer,
                consumers,
                c["batch_size"],
            ):
                raise FormatError(
                    PACK_STATE,
                    f"the state is consumer {r['consumer']} of {r['consumers']} with batch_size "
                    f"{r['batch_size']}; this is consumer {consumer} of {consumers} with "
                    f"batch_size {c['batch_size']}",
                    hint="to resume with other workers or ranks, load "
                    "matrixctl.training.merge_states(...) of every consumer's state",
                    field="consumers",
                )
            start = r["yielded"]
            self.resume = None
        self.who = (consumer, consumers)
        pack = self.pack
        count = len(pack)
        order = pack.order(self.epoch, seed=c["seed"], shuffle=c["shuffle"])
        positions = share(count, self.cut, consumer, consumers, c["batch_size"])
        self.yielded = start
        for lo in range(start, positions.size, GATHER):
            batch = pack[order[positions[lo : lo + GATHER]]]
            for row in batch:
                self.yielded += 1
                yield row


def _remaining(count: int, cut: dict[str, Any]) -> tuple[np.ndarray, int]:
    """The epoch's positions not yet yielded as (head, hi): the explicit positions from
    `position` up to the last `done` one, then every position from hi to count."""
    import numpy as np

    position = int(cut["position"])
    done = np.asarray(sorted(cut["done"]), dtype=np.int64)
    if done.size == 0:
        return np.zeros(0, dtype=np.int64), position
    hi = int(done[-1]) + 1
    head = np.arange(position, hi, dtype=np.int64)
    return head[~np.isin(head, done)], hi


def _ranks_of(length: int, consumer: int, consumers: int, chunk: int) -> np.ndarray:
    """The indexes into the remaining positions dealt to `consumer`, in order."""
    import numpy as np

    starts = np.arange(consumer * chunk, length, consumers * chunk, dtype=np.int64)
    ranks = (starts[:, None] + np.arange(chunk, dtype=np.int64)).reshape(-1)
    out: np.ndarray = ranks[ranks < length]
    return out


def share(count: int, cut: dict[str, Any], consumer: int, consumers: int, chunk: int) -> np.ndarray:
    """The positions of the epoch's order that `consumer` of `consumers` yields, in order."""
    head, hi = _remaining(count, cut)
    length = head.size + max(0, count - hi)
    return _positions(_ranks_of(length, consumer, consumers, chunk), head, hi)


def _positions(ranks: np.ndarray, head: np.ndarray, hi: int) -> np.ndarray:
    """The epoch positions of indexes into the remaining positions (`_remaining`)."""
    import numpy as np

    if head.size == 0:
        return hi + ranks
    explicit = head[np.minimum(ranks, head.size - 1)]
    out: np.ndarray = np.where(ranks < head.size, explicit, hi + ranks - head.size)
    return out


def _checked(state: Any, count: int) -> dict[str, Any]:
    if not isinstance(state, dict) or state.get("kind") != KIND:
        raise FormatError(
            PACK_STATE, "not a torch_dataset state (a dict with kind 'matrixctl.torch_dataset')"
        )
    need: dict[str, type | tuple[type, ...]] = {
        "epoch": int,
        "seed": int,
        "shuffle": bool,
        "position": int,
        "done": list,
    }
    if "consumer" in state:
        need.update(consumer=int, consumers=int, batch_size=int, yielded=int)
    for key, kind in need.items():
        value = state.get(key)
        bad = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        if bad or (isinstance(value, int) and value < 0):
            raise FormatError(PACK_STATE, f"state {key} is {value!r}", field=key)
    if state["position"] > count or any(
        not isinstance(p, int) or not state["position"] < p < count for p in state["done"]
    ):
        raise FormatError(
            PACK_STATE,
            f"state position {state['position']} or done positions are beyond the pack's "
            f"{count} atoms",
            field="position",
        )
    if "consumer" in state and not (
        state["consumer"] < state["consumers"] and state["batch_size"] >= 1
    ):
        raise FormatError(PACK_STATE, "state consumer is not below consumers", field="consumer")
    return dict(state)


def _found(obj: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(obj, dict):
        if obj.get("kind") == KIND and "consumer" in obj:
            out.append(obj)
            return
        for value in obj.values():
            _found(value, out)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _found(value, out)


def merge_states(*states: Any) -> dict[str, Any]:
    """The global state of an epoch from every consumer's state: StatefulDataLoader state dicts
    (of every rank) or `state_dict()`s of the datasets, in any nesting. Load it into a dataset
    of any number of workers and ranks to continue the same epoch without repeating or
    skipping an atom (see the module docstring)."""
    import numpy as np

    found: list[dict[str, Any]] = []
    _found(list(states), found)
    if not found:
        raise FormatError(PACK_STATE, "no torch_dataset consumer state in what was given")
    first = found[0]
    same = ("epoch", "seed", "shuffle", "position", "consumers", "batch_size")
    for s in found:
        for key in same:
            if s[key] != first[key]:
                raise FormatError(
                    PACK_STATE,
                    f"the consumer states disagree on {key} ({first[key]!r}, {s[key]!r})",
                    field=key,
                )
        if sorted(s["done"]) != sorted(first["done"]):
            raise FormatError(PACK_STATE, "the consumer states disagree on done", field="done")
    consumers = int(first["consumers"])
    by_consumer = {int(s["consumer"]): s for s in found}
    if sorted(by_consumer) != list(range(consumers)) or len(found) != consumers:
        raise FormatError(
            PACK_STATE,
            f"got the states of consumers {sorted(by_consumer)}, expected each of "
            f"0..{consumers - 1} once (every worker of every rank)",
            field="consumers",
        )
    # The count of atoms is not in a state; the positions are bounded by what was dealt.
    position = int(first["position"])
    done = [int(p) for p in first["done"]]
    chunk = int(first["batch_size"])
    head, hi = _remaining(1 << 62, {"position": position, "done": done})
    yielded: list[np.ndarray] = []
    for c in range(consumers):
        m = int(by_consumer[c]["yielded"])
        if m:
            # The first m ranks of consumer c: whole chunks, then part of one.
            full, part = divmod(m, chunk)
            starts = (np.arange(full + (part > 0), dtype=np.int64) * consumers + c) * chunk
            ranks = (starts[:, None] + np.arange(chunk, dtype=np.int64)).reshape(-1)[:m]
            yielded.append(ranks)
    ranks = np.sort(np.concatenate(yielded)) if yielded else np.zeros(0, dtype=np.int64)
    # The first rank nobody yielded, and the positions yielded after it.
    gaps = np.flatnonzero(ranks != np.arange(ranks.size))
    low = int(gaps[0]) if gaps.size else int(ranks.size)
    later = ranks[low:]
    new_position = int(_positions(np.asarray([low], dtype=np.int64), head, hi)[0])
    new_done = sorted(
        {*(int(p) for p in _positions(later, head, hi)), *(p for p in done if p > new_position)}
    )
    return {
        "kind": KIND,
        "epoch": int(first["epoch"]),
        "seed": int(first["seed"]),
        "shuffle": bool(first["shuffle"]),
        "position": new_position,
        "done": new_done,
    }


def finished(state: dict[str, Any], count: int) -> bool:
    """Whether a merged state has nothing left of its epoch (then run the next one)."""
    return int(state["position"]) >= count


__all__: Sequence[str] = ["merge_states", "share", "torch_dataset"]
