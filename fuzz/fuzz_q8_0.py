"""Fuzz harness: the Q8_0 quantizer of `convert --quantize q8_0` (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("q8_0", common.q8_0_target())
