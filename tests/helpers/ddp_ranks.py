"""One rank of the exactly-once test (tests/api/test_training.py): joins a gloo group on
loopback, reads its share of a pack through a DataLoader with 2 workers, and writes its batches
as JSON. Run as `python -m tests.helpers.ddp_ranks PACK OUT RANK WORLD PORT`."""

from __future__ import annotations

import json
import sys


def main(pack: str, out: str, rank: int, world: int, port: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import matrixctl

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        ds = matrixctl.torch_dataset(pack, seed=3, dtype="int64", batch_size=2)  # ranks from dist
        loader = DataLoader(ds, batch_size=2, num_workers=2)
        batches = [b.tolist() for b in loader]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(out, "w") as fp:
        json.dump(batches, fp)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
