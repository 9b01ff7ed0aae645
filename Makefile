# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0

.PHONY: demo test test-cuda bench browser clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	# torch first, from the pinned CPU build, so no resolver pulls a CUDA build.
	$(PIP) install --quiet $(TORCH)

$(VENV)/.installed-viz: $(PY) pyproject.toml
	$(PIP) install --quiet -e ".[viz]"
	touch $@

$(VENV)/.installed-test: $(PY) pyproject.toml
	$(PIP) install --quiet -e ".[test,viz]"
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(PIP) install --quiet -e ".[bench]"
	-$(PIP) install --quiet --no-deps embodichain==0.3.2
	touch $@

demo: $(VENV)/.installed-viz
	$(VENV)/bin/backdrive demo

# Browser previews are tested in real headless Chromium (Debian's package).
browser:
	@command -v chromium >/dev/null 2>&1 || \
	  { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "warning: could not install chromium; browser tests will fail"; }

# One pytest worker per core (the tests run single-threaded; see tests/conftest.py),
# tests handed out as workers free up.
test: $(VENV)/.installed-test browser
	$(PY) -m pytest -q -n auto --dist worksteal

# The same suite with CUDA as the device of device-generic tests (those that
# take the `device` fixture); the rest run as in `make test`. Needs a CUDA
# build of torch (TORCH=torch==2.13.0 from the CUDA index) and a GPU.
test-cuda: $(VENV)/.installed-test
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'test-cuda: torch sees no CUDA device')"
	BACKDRIVE_TEST_DEVICE=cuda $(PY) -m pytest -q -m "not browser"

# Side-by-side runs against the peers; each prints a markdown table of ratios.
bench: $(VENV)/.installed-bench
	$(PY) benchmarks/kinematics.py
	$(PY) benchmarks/dynamics.py
	$(PY) benchmarks/rollout_gradient.py
	$(PY) benchmarks/learning.py
	$(PY) benchmarks/learning_cartpole.py
	$(PY) benchmarks/contact.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info outputs
