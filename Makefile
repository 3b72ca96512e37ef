# The commands a new user needs (see README): `make try` (the command line alone, then the first
# check, seconds once installed), `make demo` and `make test` (everything). Each creates .venv on
# first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CLI    := $(VENV)/.cli-stamp

.PHONY: try demo test test-fast lint format lab notebooks api clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cli,train,notebooks,dev]'
	touch $(STAMP) $(CLI)

$(CLI): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cli]'
	touch $(CLI)

# README's "A first try": .venv with the command line only (the cli extra), then one check of
# the ring and Swing against NumPy on 4 emulated CPU devices.
try: $(CLI)
	$(BIN)/allreduce-jax verify --devices 4 --algorithms ring,swing --dtypes float32 --shapes 13

demo: $(STAMP)
	$(BIN)/allreduce-jax report --devices 8

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n 2 --durations=20

# The inner loop, a few minutes on two cores: the library's contracts (every algorithm against
# lax inside and outside shard_map, errors, gradients, wire formats, the cost model and the
# replay, the layout) and the command line's, less what is marked slow.
FAST := tests/test_all_reduce.py tests/test_errors.py tests/test_inputs.py tests/test_gradients.py \
  tests/test_fusion.py tests/test_compression.py tests/test_wire.py tests/test_hlo.py \
  tests/test_properties.py tests/test_units.py tests/test_rows.py tests/test_cost_model.py \
  tests/test_topology.py tests/test_gloo_model.py tests/test_cluster_rows.py \
  tests/test_slow_link_model.py tests/test_layout.py tests/test_cli.py \
  allreduce_jax/units.py allreduce_jax/results.py allreduce_jax/networks.py \
  allreduce_jax/registry.py allreduce_jax/cost_model.py allreduce_jax/replay.py

test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n 2 -m "not slow" --durations=10 $(FAST)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# JupyterLab on notebooks/ (lab/serve): prints the URL to open (127.0.0.1, a token); runs as
# root too. A double-click opens a .py notebook as a notebook; Lab asks for one of two kernels,
# both with 8 emulated CPU devices: "allreduce-jax" and "allreduce-jax small" (small mode).
lab: $(STAMP)
	lab/serve

# Execute every notebook, in full mode unless ALLREDUCE_JAX_SMALL=1 is set (`ALLREDUCE_JAX_SMALL=1
# make notebooks`: small mode, as CI runs them); executed copies (with outputs) go to
# results/report/notebooks/.
notebooks: $(STAMP)
	mkdir -p results/report/notebooks
	for nb in notebooks/[0-9][0-9]_*.py; do \
	  ALLREDUCE_JAX_RESULTS=$(CURDIR)/results $(BIN)/jupytext --to ipynb --set-kernel python3 --execute "$$nb" -o results/report/notebooks/$$(basename "$$nb" .py).ipynb || exit 1; \
	done

# The API reference, built from the docstrings with pdoc into results/api/ (open
# results/api/index.html). `make test` builds it too and checks every link
# (tests/test_api_docs.py).
api: $(STAMP)
	$(BIN)/python -m pdoc -o results/api $$($(BIN)/python -c "from allreduce_jax.tools import API_MODULES; print(*API_MODULES)")

clean:
	rm -rf $(VENV) results/*.smoke* .pytest_cache
