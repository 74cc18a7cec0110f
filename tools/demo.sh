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
