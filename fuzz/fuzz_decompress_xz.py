"""Fuzz harness: decompress xz, the compressed inputs of ingest docs (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("decompress_xz", common.decompress_target("xz"))
