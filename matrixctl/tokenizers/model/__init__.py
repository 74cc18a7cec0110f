"""Model-exact tokenizers: the ids a real model uses, from its GGUF vocabulary or its Hugging Face
`tokenizer.json` (docs/tokenizers.md).

Each family is a module holding one `ModelTokenizer` subclass built from plain data (the GGUF
key-value metadata as Python values, or a parsed `tokenizer.json`); `load.py` picks the family.
Like every tokenizer here, this package turns text into ids and back and imports no codec:
reading the GGUF file is the caller's (`matrixctl.tokenizing`).
"""
