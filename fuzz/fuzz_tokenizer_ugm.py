"""Fuzz harness: the ugm model tokenizer on llama.cpp's nomic-bert-moe vocabulary (see
fuzz/common.py, model_tokenizer_target)."""

import common

if __name__ == "__main__":
    common.main("tokenizer_ugm", common.model_tokenizer_target("ugm", "nomic-bert-moe"))
