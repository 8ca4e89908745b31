# two entry points: `make run` (the main job on the embedded default) and `make test`.
# both bootstrap .venv from nothing; the stamp makes the second call fast.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "[make] installing into $(VENV) (first time only)"
	@# the CPU build of torch lies on this machine's disk: installing it by exact version downloads nothing
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,serve,tp,tensorrt]' 2>&1 | grep -v "^WARNING: Location" || true
	@# the real tritonserver binary (nvidia-pytriton ships it); --no-deps: we use the binary, not its Python API
	$(PY) -m pip install -q --disable-pip-version-check --no-deps nvidia-pytriton==0.7.0 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c "import torch, numpy, safetensors, transformers, pytest, xdist, tritonclient.grpc, tokenizers, mpi4py, tensorrt_rtx, importlib.util as u; assert u.find_spec('pytriton')" || (echo "[make] install failed" && exit 1)
	@rm -f $(VENV)/.installed-*
	@touch $@

run: $(STAMP)
	$(PY) -m trtllm_dasc.demo

# two workers, one test file each at a time (--dist loadfile keeps a file's module fixtures, its servers, in
# one process): on the 2-core CI machine the servers' start-up waits and the model runs overlap. A plain
# `pytest` (one file, a GPU machine without xdist) runs serially as before. TEST_WORKERS=0: serial. Every test
# process runs one OpenMP thread (tests/conftest.py says why).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
