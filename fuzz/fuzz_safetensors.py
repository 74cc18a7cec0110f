"""Fuzz harness: safetensors (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("safetensors", common.examine_target("safetensors"))
