# ddp-cluster: `make demo` brings up the local cluster and trains on it; `make check` is the first signal (about two
# minutes, no torch, no containers); `make test` runs every check.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# The Python .venv is made with: empty, the first of python3.13, python3.12, python3.11 (and python3) on PATH that
# the pinned Ansible runs on (ansible-core 2.19: 3.11 to 3.13); scripts/find-python.sh checks either.
PYTHON ?=
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_FORCE_COLOR ?= false
export PY_COLORS ?= 0
# The base image make base-image builds when missing: BASE_IMAGE, else the one the inventory names where
# ANSIBLE_INVENTORY picks one (a CANN or NGC base: nothing is built, the image stage uses or pulls it), else the
# local inventory's.
ifeq ($(origin BASE_IMAGE),undefined)
BASE_IMAGE := $(or $(if $(ANSIBLE_INVENTORY),$(shell scripts/inventory-base-image.sh)),ddp-cluster/base:bookworm)
endif
NODES ?= 2
TORCH_VERSION ?= 2.13.0
MOLECULE_SCENARIOS := $(sort $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml))))

.PHONY: help venv dev test-deps setup venv-and-base-image docker base-image registry image site train demo check check-lint check-unit check-package lint unit molecule e2e sim-e2e suites sim-up sim-down test bench clean

help:
	@echo "make demo    set up this machine and run site.yml, then train.yml -e nodes=$(NODES), on the local cluster"
	@echo "make check   lint and every test that needs no container, no torch and no network (about 2 minutes)"
	@echo "make test    lint, unit tests, molecule scenarios and end-to-end tests"
	@echo "make lint    yamllint, ansible-lint, ruff, mypy, import-linter (the package's layering)"
	@echo "make bench   benchmarks (figures, not tests)"
	@echo "make clean   remove the local cluster's containers, network and state (refused while a job runs: FORCE=true)"
	@echo "make venv    .venv with what running needs, pinned, on Python 3.11-3.13 (PYTHON=... picks the interpreter)"
	@echo "make dev     .venv with the linters and test tools too (make check and make test install them)"
	@echo "make registry  install Docker's Distribution registry, which registry distribution runs on the controller"
	@echo "make sim-up  start SIM_SERVERS (default 2) simulated servers for inventories/sim and sim-ascend; sim-down removes them"

# The pinned ansible-core runs on Python 3.11 to 3.13 only, and pip's resolver says no more than "no matching
# distribution" elsewhere: find-python.sh picks a supported interpreter or names the command that installs one,
# keeps a .venv already on a supported Python and has one on another rebuilt.
#
# What running needs only (requirements/controller.txt): ansible-core, the Docker SDK, matplotlib for the loss plot,
# the package bare, and the four collections the roles use, unpacked from the pinned `ansible` release's wheel
# (scripts/install-collections.sh; the whole release is some 480 MB of collections).
venv: $(VENV)/.installed
$(VENV)/.installed: requirements/controller.txt requirements/collections.txt scripts/install-collections.sh python/pyproject.toml
	@python=$$(PYTHON='$(PYTHON)' scripts/find-python.sh $(VENV)); \
	if [ -n "$$python" ]; then rm -rf $(VENV); echo "$$python -m venv $(VENV)"; "$$python" -m venv $(VENV); fi
	$(BIN)/pip install --quiet -r requirements/controller.txt -e python
	scripts/install-collections.sh $(VENV)
	touch $@

# What developing needs on top (requirements/dev.txt): the linters, pytest, molecule, ansible-runner; no torch.
dev: $(VENV)/.installed-dev
$(VENV)/.installed-dev: $(VENV)/.installed requirements/dev.txt
	$(BIN)/pip install --quiet -r requirements/dev.txt
	touch $@

# The tests train for real, so they need torch on the controller too (the demo and make check do not).
test-deps: $(VENV)/.installed-test
$(VENV)/.installed-test: $(VENV)/.installed-dev
	$(BIN)/pip install --quiet -e 'python[train,plot,test]' 'torch==$(TORCH_VERSION)'
	touch $@

# The controller's system tools come from scripts/install-tool.sh (apt-get, else dnf, else yum; as root), each
# only where the chosen path needs it. The engine, always:
docker:
	@scripts/ensure-docker.sh

# debootstrap only builds the project's own base images (ddp-cluster/base:*), and only when the engine lacks one;
# any other base is the user's: the image stage uses it as found, pulls it, or stops naming it.
PROJECT_BASE := $(filter ddp-cluster/base:%,$(BASE_IMAGE))
base-image: docker
	@$(if $(PROJECT_BASE),docker image inspect '$(BASE_IMAGE)' >/dev/null 2>&1 || scripts/install-tool.sh debootstrap)
	@$(if $(PROJECT_BASE),scripts/build-base-image.sh $(BASE_IMAGE),echo "base image $(BASE_IMAGE): yours, used as found or pulled by the image stage")

# Docker's Distribution registry, which the image stage runs on the controller's loopback when servers are remote
# and name no registry of their own (the sim, a real cluster; not the local inventory). On dnf systems the
# package is docker-distribution and its command `registry`: install-tool.sh says which setting to change.
registry:
	@scripts/install-tool.sh docker-registry

# The virtualenv (pip) and the base image (debootstrap) wait on different things: made side by side.
setup:
	@$(MAKE) --no-print-directory -j2 venv-and-base-image
venv-and-base-image: venv base-image

image: setup
	ansible-playbook site.yml --tags preflight,image

site: setup
	ansible-playbook site.yml

train: venv
	ansible-playbook train.yml -e nodes=$(NODES)

demo: site
	@if [ -f train.yml ]; then ansible-playbook train.yml -e nodes=$(NODES); fi

# The linters, quickest first; $(1): more flags for the package's mypy run.
define lint-commands
ruff check . && ruff format --check .
lint-imports
yamllint -s .
cd python && mypy $(1)
mypy --config-file mypy.ini
ansible-lint
endef

# mypy reads torch's types, so the package's full type check needs the test dependencies installed.
lint: test-deps
	$(call lint-commands)

# The first signal: the linters, tests/unit and the package's tests side by side, the tests those that need no
# container, no torch and no network (the tiers are marked in python/tests/conftest.py and tests/conftest.py); each
# part's output is printed whole as it ends. The tests mostly wait (on Ansible, on their processes), the linters
# mostly compute. Without torch mypy takes torch's types as Any, so it cannot judge an unused ignore, a subclass of
# a torch class or a torch decorator there: make lint still does.
check: dev
	@$(MAKE) --no-print-directory -j3 --output-sync=target check-lint check-unit check-package

check-lint: dev
	$(call lint-commands,--no-warn-unused-ignores --allow-subclassing-any --allow-untyped-decorators)

check-unit: dev
	pytest -q -m "not network" tests/unit

check-package: dev
	cd python && pytest -q -m "not torch"

# The playbooks' pieces that need no engine and no cluster (tests/unit: filters, modules, the controller's scripts,
# the roles' specs), then the package's tests, the multi-process ones among them.
unit: test-deps
	pytest -q tests/unit
	cd python && pytest -q

# `make suites` builds the image once before it starts the scenarios (MOLECULE_DEPS=test-deps there).
MOLECULE_DEPS ?= test-deps image
molecule: $(MOLECULE_DEPS)
	@mkdir -p build
	@for scenario in $(MOLECULE_SCENARIOS); do \
	  echo "== molecule test -s $$scenario"; \
	  molecule test -s $$scenario > build/molecule-$$scenario.log 2>&1 \
	    || { tail -n 80 build/molecule-$$scenario.log; echo "molecule scenario $$scenario failed (log: build/molecule-$$scenario.log)"; exit 1; }; \
	  grep -E "passed|failed" build/molecule-$$scenario.log | tail -n 1 || true; \
	done

# The local tests, on real containers (make unit runs tests/unit); they include the controller's registry's own
# (tests/test_controller_registry.py; skipped without it).
e2e: test-deps base-image registry
	pytest -q --durations=40 tests --ignore=tests/sim --ignore=tests/unit

# The real-cluster path on simulated servers (made fresh for the run, removed after it): tests/sim's files run in
# name order, a stage each, on one set of servers (tests/sim/conftest.py).
sim-e2e: test-deps base-image registry
	pytest -q --durations=40 -p no:cacheprovider tests/sim

# Simulated servers (sim-server0...) with their own Docker engine, sshd and firewall: see docs/sim.md.
SIM_SERVERS ?= 2
sim-up: venv registry
	SIM_SERVERS=$(SIM_SERVERS) PYTHON=$(BIN)/python TORCH_VERSION=$(TORCH_VERSION) scripts/sim.sh up

sim-down:
	scripts/sim.sh down

# The local end-to-end tests in one sequence; the linters, the unit tests, the molecule scenarios then the sim's
# end-to-end tests in the other. They use their own containers, networks and image names on this engine, so they
# run side by side, each into its own log under build/, printed as it ends (measured on a 2-core machine: about
# 72 minutes for the first, 10 + 7 + 50 for the second). The local image is built first: the sim's, under its own
# name, then comes from the build cache. The registry is installed before, not by both sequences at once.
# SUITES_FIRST: what the second sequence runs before molecule (make test: lint unit).
SUITES_FIRST ?=
suites: test-deps base-image registry image
	@scripts/side-by-side.sh \
	  build/test-local.log "$(MAKE) --no-print-directory e2e" \
	  build/test-sim.log "$(MAKE) --no-print-directory $(SUITES_FIRST) molecule sim-e2e MOLECULE_DEPS=test-deps"

# Everything, in two sequences side by side (see suites): the linters and the unit tests mostly compute while the
# end-to-end tests mostly wait, so the first ten minutes of the local end-to-end tests overlap them (make check,
# which CI runs first, is the quick signal of the linters and the fast tests).
test:
	@$(MAKE) --no-print-directory suites SUITES_FIRST="lint unit"

bench: test-deps base-image registry
	$(BIN)/python bench/bench_site.py
	$(BIN)/python bench/bench_train.py
	$(BIN)/python bench/bench_launch.py
	$(BIN)/python bench/bench_distribution.py

# A node where a job runs is refused, naming the job, and nothing is removed; FORCE=true stops the jobs first.
# The jobs' results under runs/ are never removed.
clean: venv
	ansible-playbook playbooks/teardown.yml $(if $(FORCE),-e force=$(FORCE))
