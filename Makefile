# Two entry points on a machine with only python3: `make demo` and `make test`.
# Each creates (once) and uses its own virtual environment in .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the CPU build on this project's machines; a bare "torch" would fetch the newest CUDA build
TORCH ?= torch==2.13.0

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet '$(TORCH)'
	$(BIN)/python -m pip install --quiet -e '.[dev,dask,torch]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/zbopt simulate examples/demo.yaml --schedule 1f1b -o demo_1f1b.png
	$(BIN)/zbopt simulate examples/demo.yaml --schedule gpipe -o demo_gpipe.png
	$(BIN)/zbopt compare examples/demo.yaml --optimal --time-limit 30 -o demo_report.html
	@echo "zbopt is installed in $(VENV): type '. $(BIN)/activate' to use 'zbopt' in this shell, or run $(BIN)/zbopt"

lint: $(STAMP)
	$(BIN)/ruff check .

# the extras installed above must be there: a test needing a missing one fails, not skips (tests/conftest.py);
# one worker per core (pytest-xdist)
test: lint
	ZBOPT_REQUIRE_EXTRAS=torch,dask $(BIN)/python -m pytest -n auto

# Six benchmarks with quick settings: about 5 minutes on 2 cores. The full runs:
# bench_solver.py A (60 s per solve, CP-SAT and HiGHS), bench_solver.py B, bench_milp_models.py (60 s),
# bench_scale.py (p = 64, m = 4096 at 60 s and the V-shape grid at 60 s per solve).
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_startup.py
	$(BIN)/python benchmarks/bench_simulator.py
	$(BIN)/python benchmarks/bench_heuristics.py
	$(BIN)/python benchmarks/bench_solver.py A --solvers cpsat --time-limit 2
	$(BIN)/python benchmarks/bench_milp_models.py --time-limit 3
	$(BIN)/python benchmarks/bench_scale.py --quick --time-limit 10

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info
