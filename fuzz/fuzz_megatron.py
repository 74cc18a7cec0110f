"""Fuzz harness: Megatron .idx (see fuzz/common.py; the .bin beside it is absent, so the size
rule reports it and the array rules run on the index alone)."""

import common

if __name__ == "__main__":
    common.main("megatron", common.examine_target("megatron", ".idx"))
