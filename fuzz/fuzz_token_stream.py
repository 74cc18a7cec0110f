"""Fuzz harness: token stream (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("token_stream", common.examine_target("token-stream"))
