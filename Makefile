# tfhpc: the front door. `make help` lists targets and variables; set variables on the command line,
# e.g. `make image MPI=mpich STACK=conservative`. Versions are never written here: see versions.toml.
SHELL := /bin/bash
.DEFAULT_GOAL := help

STACK ?=##         stack in versions.toml (latest | conservative; default: versions.toml's default_stack)
FLAVOR ?=##        image flavour (cpu | gpu; default: versions.toml's default_flavor)
MPI ?=##           MPI implementation (openmpi | mpich | abi: the MPI 5.0 standard ABI; default: versions.toml's default_mpi)
ARCH ?=##          target architecture (amd64 | arm64, tagged -arm64; default: versions.toml's default_arch; docs/arm64.md)
BASE_SOURCE ?= auto##  OS root image: registry | debootstrap | auto (registry if reachable, else debootstrap)
CA_BUNDLE ?=##     PEM CA bundle for apt/pip during builds only ("none" to disable; default: $PIP_CERT etc.)
PIP_INDEX_URL ?=## PyPI mirror for builds (a BuildKit secret for `make image`, a %post-only file for `make native-sif`)
LAYER ?=##         last layer to build with `make image` (default: app, the leaf)
SIGN_KEY ?=##      PEM private key: `make sif`/`make push` sign the SIF (apptainer sign --key) and the provenance
SQUASHFS_LEVEL ?=## squashfs level of `make sif` (zstd: 1-22; default: mksquashfs's, the shipped SIF's)
SITE_SQUASHFS_LEVEL ?= 1## `make site-images`' level: the site tests' SIFs, converted fast (same zstd, larger file)
REGISTRY ?=##      registry for `make push`: host[:port][/namespace], e.g. 127.0.0.1:5000 or ghcr.io/org
PYTEST_ARGS ?=##   extra pytest arguments, e.g. -k collectives
TEST_WORKERS ?= 2## `make test`'s pytest workers (pytest-xdist; 1: one process, in collection order)
UPGRADE ?=##       1: `make lock` resolves every package anew instead of keeping the locked versions
NGC_IMAGE ?=##     local NGC TensorFlow image for `make bench FLAVOR=gpu`'s size goal (default: versions.toml's figure)
QUICK ?=##         1: `make bench` runs its short version (~3 min, into build/bench/quick/; `make test-full` runs it)
INSIST ?=##        1: `make bench` measures on a busy machine too (marked so) instead of waiting, then refusing
HOROVOD_SRC ?=##   `make upstream-tests`: a Horovod git checkout to read its test suites from (default: GitHub)
VENV ?= .venv##    host virtual environment for the tooling and tests

export STACK FLAVOR MPI ARCH BASE_SOURCE CA_BUNDLE PIP_INDEX_URL LAYER SIGN_KEY SQUASHFS_LEVEL REGISTRY NGC_IMAGE
export HOROVOD_SRC
PYTHON := $(VENV)/bin/python

.PHONY: help venv image sif recipes native-sif test test-full test-unit test-cluster test-images clean clean-all show bench
.PHONY: push pipelines lint sqsh edf site-images test-sites lock repro measurements upstream-tests test-arm64 test-network

help: ## list targets and variables
	@echo "targets:"
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## (.*)/  make \1\t\2/' | expand -t 22
	@echo "variables:"
	@grep -hE '^[A-Z_]+ \?=' $(MAKEFILE_LIST) | sed -E -e 's/^([A-Z_]+) \?= *([^# ][^#]*[^# ]|[^# ])## *(.*)/  \1\t\3 (default: \2)/' \
	    -e 's/^([A-Z_]+) \?=[^#]*## *(.*)/  \1\t\2/' | expand -t 22

venv: $(VENV)/.installed ## create the host virtual environment (docker SDK, pytest, testinfra)
$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -r requirements.txt
	touch $@

image: venv ## build the image stack (base -> mpi -> tensorflow -> horovod -> app); build/images.json, sbom/, provenance/
	$(PYTHON) -m tfhpc build

sif: image ## convert the app image into build/sif/*.sif (apptainer on the host or in a helper)
	$(PYTHON) -m tfhpc sif

lock: venv ## regenerate locks/ (every layer's Python packages with their sha256 hashes) from versions.toml with uv (ARCH=, FLAVOR=: only those)
	$(PYTHON) -m tfhpc lock $(if $(filter-out 0,$(UPGRADE)),--upgrade)

recipes: venv ## regenerate recipes/native/ (native Apptainer recipes from the Dockerfiles, via spython)
	$(PYTHON) -m tfhpc recipes

native-sif: venv ## build build/native/*.sif from recipes/native/ with apptainer (no Docker build; ~30 min here)
	$(PYTHON) -m tfhpc native-sif

push: venv ## push the built images, the SIF, SBOMs and provenance (signed with SIGN_KEY if given) to REGISTRY
	$(PYTHON) -m tfhpc push

pipelines: venv ## regenerate ci/ (GitHub Actions, GitLab CI) from containers/layers.toml
	$(PYTHON) -m tfhpc pipelines

measurements: venv ## regenerate docs/measurements.md from docs/measurements/records.toml (append a record there)
	$(PYTHON) -m tfhpc measurements

lint: venv ## hadolint every Dockerfile, shellcheck every shell script, check ci/ against its schemas (part of test)
	$(PYTHON) -m pytest tests/unit/test_lint.py tests/unit/test_ci_pipelines.py $(PYTEST_ARGS)

bench: venv ## measure the built images and SIF side by side: build/bench/results.{json,md} + PNG plots (QUICK=1)
	$(PYTHON) -m tfhpc bench $(if $(filter-out 0,$(QUICK)),--quick) $(if $(filter-out 0,$(INSIST)),--insist)

upstream-tests: image ## Horovod's own TF2/Keras suites (pinned release) on 2 ranks with Keras 3 and tf_keras
	$(PYTHON) -m tfhpc upstream-tests

show: venv ## print the resolved versions, build arguments and image names
	$(PYTHON) -m tfhpc show

PYTEST_WORKERS = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

test: sif site-images ## build images and SIFs if needed, then the `test` tier: every behaviour once (docs/testing.md)
	TFHPC_TIER=test $(PYTHON) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-full: sif site-images ## `make test` plus the `full` tier: patch reversals, the quick bench, every layer's image, repeats
	TFHPC_TIER=full $(PYTHON) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

site-images: venv ## the MPICH stack's images and SIF, and the standard-ABI stack's (MPI=abi) where the stack has one: tests/sites runs them with host MPIs
	mpis=$$($(PYTHON) -m tfhpc site-mpis) || exit 1; for mpi in $$mpis; do \
	  $(MAKE) sif MPI=$$mpi SQUASHFS_LEVEL=$(SITE_SQUASHFS_LEVEL) || exit 1; done

test-sites: sif site-images ## site tests only: host MPIs in the MPICH image (bind model), the Open MPI hybrid launch
	$(PYTHON) -m pytest tests/sites $(PYTEST_ARGS)

test-cluster: sif ## multi-node tests only: 2 containers as nodes (ssh, MPI, Gloo, MWMS) and a Slurm cluster
	$(PYTHON) -m pytest tests/cluster $(PYTEST_ARGS)

test-images: image ## tooling and image tests only (no SIF, no cluster): the GPU flavour's suite is `make test-images FLAVOR=gpu`
	$(PYTHON) -m pytest tests/unit tests/images $(PYTEST_ARGS)

test-arm64: venv ## build both architectures' images and SIFs if needed, then the arm64 checks under emulation (not in `make test`)
	$(MAKE) sif ARCH=amd64
	$(MAKE) sif ARCH=arm64
	ARCH=arm64 $(PYTHON) -m pytest tests/arm64 $(PYTEST_ARGS)

test-unit: venv ## tooling tests only (no docker needed)
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

test-network: venv ## tests that read PyPI (or PIP_INDEX_URL's mirror), no docker: e.g. whether TensorFlow's aarch64 wheel has CUDA yet
	$(PYTHON) -m pytest tests/network $(PYTEST_ARGS)

repro: venv ## build the tensorflow and app layers twice without cache on the stack's images, compare their files (build/repro/)
	$(PYTHON) -m tfhpc repro

clean: venv ## remove dangling images and the docker build cache
	$(PYTHON) -m tfhpc clean

clean-all: venv ## `clean`, and remove every tfhpc image and build/
	$(PYTHON) -m tfhpc clean --all
	rm -rf build

sqsh: image ## write build/sqsh/*.sqsh: the app image as enroot/pyxis squashfs (enroot import's layout)
	$(PYTHON) -m tfhpc sqsh

edf: venv ## write build/edf/*.toml: a CSCS Container Engine EDF (image: REGISTRY's tag, else `make sqsh`'s file)
	$(PYTHON) -m tfhpc edf
