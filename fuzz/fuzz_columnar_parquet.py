"""Fuzz harness: parquet inputs of ingest docs, through pyarrow (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("columnar_parquet", common.columnar_target("parquet"))
