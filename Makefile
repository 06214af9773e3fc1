# The two commands a newcomer needs:  `make demo`  and  `make test`.
# Both create the virtualenv and build (or reuse) the sandbox binaries first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test venv sandbox-binaries node-binaries images helm lint unit crds bench bench-peers clean release

demo: venv sandbox-binaries
	$(BIN)/python -m tidal.sandbox demo

test: venv sandbox-binaries node-binaries images helm lint
	$(BIN)/pytest

venv: $(VENV)/.installed

# The dependencies are the versions uv.lock pins (hash-checked), then tidal and the sandbox
# without dependencies. After changing pyproject.toml's dependencies: make lock.
$(VENV)/.installed: pyproject.toml e2e/sandbox/pyproject.toml uv.lock
	@echo "[make] creating $(VENV) and installing tidal with its dev dependencies (uv.lock)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	$(BIN)/uv export -q --frozen --no-emit-project --extra dev -o $(VENV)/requirements.txt
	$(BIN)/uv pip install -q --python $(BIN)/python -r $(VENV)/requirements.txt
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e . -e ./e2e/sandbox
	@touch $@

# Re-resolve uv.lock from pyproject.toml and write the images' pinned requirements from it
# (images/requirements/; tests/test_lock.py fails when either is stale).
.PHONY: lock
lock: venv
	$(BIN)/uv lock
	$(BIN)/uv export -q --frozen --no-emit-project --extra operator \
	  -o images/requirements/operator.txt
	$(BIN)/uv export -q --frozen --no-emit-project --extra runtime --extra gateway --extra builder \
	  -o images/requirements/runtime-cpu.txt

sandbox-binaries:
	bash e2e/sandbox/build-binaries.sh

# The real node's programs (kubelet, kube-proxy, containerd, runc, CNI, CoreDNS, pause) and the
# Debian tools for it and for building images (buildah, mmdebstrap, nftables).
node-binaries: sandbox-binaries
	bash e2e/sandbox/build-node.sh

# The project's images (images/*.Dockerfile) built with buildah on a Debian base, as OCI archives
# in ~/.cache/tidal/images (the real node imports them; `make test` builds them on demand).
images: venv node-binaries
	$(BIN)/tidal-sandbox images

# The release: build the images, push them and the chart (an OCI artifact) to REGISTRY
# (HOST[:PORT][/PATH]; credentials in TIDAL_REGISTRY_USER/TIDAL_REGISTRY_PASSWORD, helm's from
# `helm registry login`). The same script pushes to the sandbox's registry in `make test`.
REGISTRY ?=
release: venv node-binaries helm
	@test -n "$(REGISTRY)" || { echo "usage: make release REGISTRY=registry.example.com/you" >&2; exit 2; }
	$(BIN)/tidal-sandbox release --registry $(REGISTRY)

# Helm v4 from the Go module proxy, for the chart's tests.
helm:
	bash e2e/helm/build-helm.sh >/dev/null

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy tidal/operator tidal/runtime tidal/gateway tidal/common tidal/sandbox
	$(BIN)/lint-imports

# Regenerate crds/ from the pydantic models (a test fails when they drift).
crds: venv
	$(BIN)/python -m tidal.operator.crdgen --readme operator/README.md crds/
	cp crds/*.yaml charts/tidal/crds/

unit: venv
	$(BIN)/pytest -m "not sandbox"

# GPU tests (tests/gpu, marked gpu): only on a machine where torch sees a CUDA device, such as
# the device machine (`make gpu-test PYTEST="python3 -m pytest"`); CI reports them as skipped.
# --confcutdir: the root conftest (the sandbox plugin: cryptography, kubernetes) is not needed.
.PHONY: gpu-test
PYTEST ?= $(BIN)/pytest
gpu-test:
	$(PYTEST) -p no:cacheprovider --confcutdir=tests/gpu -m gpu tests/gpu

# Benchmarks: each prints ratios against a baseline measured in the same run.
bench: venv
	$(BIN)/python bench/autoscale_sim.py
	$(BIN)/python bench/fleet_sim.py
	$(BIN)/python bench/runtime_bench.py
	$(BIN)/python bench/gateway_bench.py

# tidal beside the real peers (KEDA, HPA on CPU through metrics-server) on the real node, same
# pods and traffic: builds KEDA and metrics-server from the Go module proxy into ~/.cache/tidal
# when missing, runs four traces and prints the table (bench/RESULTS.md). Not part of `make test`.
bench-peers: venv sandbox-binaries node-binaries images
	bash e2e/sandbox/build-peers.sh
	$(BIN)/python bench/peers_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
