# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0

.PHONY: demo test bench browser clean

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

test: $(VENV)/.installed-test browser
	$(PY) -m pytest -q

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
