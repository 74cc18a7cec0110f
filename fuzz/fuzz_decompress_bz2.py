"""Fuzz harness: decompress bz2, the compressed inputs of ingest docs (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("decompress_bz2", common.decompress_target("bz2"))
