"""Fuzz harness: scx shard (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("scx_shard", common.examine_target("scx-shard"))
