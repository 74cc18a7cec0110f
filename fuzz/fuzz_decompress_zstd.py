"""Fuzz harness: decompress zstd, the compressed inputs of ingest docs (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("decompress_zstd", common.decompress_target("zstd"))
