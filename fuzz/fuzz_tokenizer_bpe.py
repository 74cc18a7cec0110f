"""Fuzz harness: the byte-level BPE model tokenizer on llama.cpp's llama-bpe vocabulary (Llama
3's pre-tokenizer; every byte has a token, so every text round-trips; see fuzz/common.py,
model_tokenizer_target)."""

import common

if __name__ == "__main__":
    common.main("tokenizer_bpe", common.model_tokenizer_target("bpe", "llama-bpe"))
