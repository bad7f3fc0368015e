# The two commands of the README, and the steps they are made of. Every target installs what it needs
# (the virtual environment, the Go-built binaries, the simulated GPU libraries), so a fresh clone
# needs nothing but `make test` or `make demo`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
VENV_STAMP := $(VENV)/.installed
PY := $(VENV)/bin/python
# The product (tessera/), the development distribution (dev/pyproject.toml: testbed, simgpu, demo,
# tools), and what checks and measures them.
PY_SOURCES := tessera testbed simgpu demo tools tests benchmarks setup.py

# The CUDA 13 line of NVIDIA's Python clients (dev/clients-cuda13): a venv of its own, since
# cuda-bindings 13 cannot share .venv with the CUDA 12 line; the real-client tier (tests/clients)
# runs its client programs with this interpreter.
CUDA13_VENV := .venv-cuda13
CUDA13_STAMP := $(CUDA13_VENV)/.installed
CUDA13_LIST := dev/clients-cuda13

.PHONY: help test demo venv clients-cuda13 host-packages binaries demo-binaries simgpu images lint unit integration e2e dockerfile clean

help:
	@echo "make test   set everything up, lint, and run every test tier that this machine can run"
	@echo "make demo   set everything up and run the demo"
	@echo "make host-packages | binaries | demo-binaries | simgpu | images | venv | clients-cuda13 | lint | unit | integration | e2e | dockerfile | clean"

# Reinstall when the dependency lists or their pins change; pip does nothing for what is already there.
# The install also regenerates the gRPC stubs, so a changed .proto file triggers it too. The product and
# the development distribution (dev/: the test bed and the checkers) are both installed editable, in one
# pip call: tests and the test bed import both. Every version, pip's own and those of the isolated
# builds of the two included, is constraints.txt's.
$(VENV_STAMP): pyproject.toml dev/pyproject.toml constraints.txt $(wildcard tessera/proto/*/*/*.proto)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --constraint constraints.txt pip
	$(VENV)/bin/pip install --quiet --constraint constraints.txt --build-constraint constraints.txt -e . -e dev
	touch $@

venv: $(VENV_STAMP)

$(CUDA13_STAMP): $(CUDA13_LIST)/requirements.txt $(CUDA13_LIST)/constraints.txt
	$(PYTHON) -m venv $(CUDA13_VENV)
	$(CUDA13_VENV)/bin/pip install --quiet --constraint $(CUDA13_LIST)/constraints.txt pip
	$(CUDA13_VENV)/bin/pip install --quiet --constraint $(CUDA13_LIST)/constraints.txt -r $(CUDA13_LIST)/requirements.txt
	touch $@

clients-cuda13: $(CUDA13_STAMP)

# Debian packages the builds and the real nodes need (gcc, libseccomp-dev for runc, iproute2).
host-packages:
	bash testbed/install-host-packages.sh

# Control-plane, node and Helm binaries from the Go module proxy, cached under ~/.cache/tessera.
binaries: host-packages
	bash testbed/build-binaries.sh

# What the demo runs, no more: every component but Prometheus (only the metrics tests run it).
DEMO_COMPONENTS = etcd helm kubernetes containerd runc cri-tools cni-plugins kueue
demo-binaries: host-packages
	bash testbed/build-binaries.sh $(DEMO_COMPONENTS)

simgpu:
	$(MAKE) -C simgpu -j2

# Tessera's driver and webhook images as OCI archives, with no container engine or registry
# (images/README.md); the end-to-end tests build them on demand, into the same cache.
images: venv
	$(PY) -m testbed.product_images

lint: venv
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)
	$(VENV)/bin/mypy $(PY_SOURCES)

unit: venv clients-cuda13 simgpu
	$(PY) -m pytest -m "not integration and not e2e and not dockerfile"

integration: venv binaries
	$(PY) -m pytest -m integration

# Real nodes (kubelet, containerd, runc) need root; the tests skip with that reason otherwise.
e2e: venv binaries
	$(PY) -m pytest -m e2e

# images/Dockerfile built by buildah, as users build it, and compared with the test bed's images
# (images/README.md); root only, skipped otherwise. Builds only when the Dockerfile or the sources changed.
dockerfile: venv host-packages
	$(PY) -m pytest -m dockerfile

# Two phases, each its own pytest run and JUnit report (`$(PY) -m tools.test_durations` sums them per
# module), each ending with its slowest tests. First every test not marked `alone`, on TEST_WORKERS
# pytest-xdist workers, a whole module per worker at a time (the modules sharing the control plane
# with Kueue as one unit: tests/conftest.py), in the order tests/conftest.py gives them (slowest
# tier first; xdist's own reordering by test count is off), each worker with its own control plane
# and nodes: most of the suite waits (outages, leases, alerts, rollouts), so the waits overlap on two
# cores. Then the `alone` tests, which measure shares of time or behaviour under load, with nothing
# beside them. Both phases run even if the first fails; make fails if either did. pytest exits 5
# when it collected no test, and make treats that, like any non-zero status, as failure.
TEST_REPORTS := build/test-results
# Four: the 2-core machine idles through most of the suite's waits (docs/testbed.md has the figures);
# `make test TEST_WORKERS=1` runs the first phase in one process.
TEST_WORKERS ?= 4
test: venv clients-cuda13 binaries simgpu lint
	rm -f $(TEST_REPORTS)/*.xml
	status=0; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone" --junitxml=$(TEST_REPORTS)/parallel.xml --durations=25 || status=$$?; \
	$(PY) -m pytest -m alone --junitxml=$(TEST_REPORTS)/alone.xml --durations=10 || status=$$?; \
	exit $$status

demo: venv demo-binaries simgpu
	$(PY) -m demo

clean:
	rm -rf build $(VENV) $(CUDA13_VENV) tessera/shim/lib tessera/shim/_format*.so *.egg-info dev/*.egg-info
	find tessera/proto -name '*_pb2.py' -delete -o -name '*_pb2_grpc.py' -delete
