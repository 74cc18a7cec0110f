"""Fuzz harness: ztensor2, the zTensor 2 reader and its validation rules (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("ztensor2", common.examine_target("ztensor-v2", ".zt"))
