"""Fuzz harness: decompress gzip, the compressed inputs of ingest docs (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("decompress_gzip", common.decompress_target("gzip"))
