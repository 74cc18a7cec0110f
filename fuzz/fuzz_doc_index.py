"""Fuzz harness: doc index (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("doc_index", common.examine_target("doc-index"))
