"""Fuzz harness: the spm model tokenizer on llama.cpp's llama-spm vocabulary (see
fuzz/common.py, model_tokenizer_target)."""

import common

if __name__ == "__main__":
    common.main("tokenizer_spm", common.model_tokenizer_target("spm", "llama-spm"))
