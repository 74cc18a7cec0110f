"""Fuzz harness: dictionary-encoded Arrow IPC text columns built from the input, under a
memory bound (see fuzz/common.py, `dictionary_target`)."""

import common

if __name__ == "__main__":
    common.main("columnar_dictionary_arrow", common.dictionary_target("arrow"))
