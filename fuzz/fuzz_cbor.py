"""Fuzz harness: cbor (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("cbor", common.cbor_target())
