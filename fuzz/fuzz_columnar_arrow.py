"""Fuzz harness: arrow inputs of ingest docs, through pyarrow (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("columnar_arrow", common.columnar_target("arrow"))
