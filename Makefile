# One entry point for users and CI. Every target installs what it needs through `setup`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
CDK := node_modules/.bin/cdk
STAMP := $(VENV)/.setup-stamp
OUTPUTS ?= cdk-outputs.json
# The CDK CLI runs app.py with the venv's interpreter (see cdk.json "app").
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

.PHONY: help setup test test-fast lint synth diff deploy demo train-local train-job train-job-status \
        train-job-delete image teardown plan cost-report bench bench-quick bench-setup bench-calibrate report docs-config clean \
        test-torch lock

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

# The Python packages come from requirements/dev.txt, a lock with every version and its hashes (make lock):
# pip's hash-checking mode installs nothing else. The kit itself goes in editable, built with the venv's own
# setuptools (offline). requirements/README.md says why the locks are pip-tools' and not uv's.
$(STAMP): requirements/dev.txt pyproject.toml package.json package-lock.json
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run 'make PYTHON=python3 ...'" >&2; exit 1; }
	@command -v npm >/dev/null || { echo "error: npm not found; install Node.js 20+ (it runs the CDK CLI)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --require-hashes -r requirements/dev.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

setup: $(STAMP) ## create .venv and install the pinned Python and npm packages (idempotent)

demo: $(STAMP) ## synth offline, run the local Job with a kill, an exception and a hang; report, PNG, kit vs sync vs torchrun
	$(PY) -m demo

test: $(STAMP) ## run every test (lint, infra, training, k8s, ops, demo): the slow ones alone, the rest beside them
	$(PY) -m ruff check .
	$(PY) -m tools.run_tests

test-fast: $(STAMP) ## the tests without the slow multi-process ones, on every core
	$(PY) -m pytest -m "not slow" -n auto

# Another torch in its own venv (.venv-torch-X.Y.Z): the launcher, checkpoint, in-process and torch-internals
# tests, the parts that lean on torch's private names (training/runtime/torch_internals.py). Not in `make test`: a
# torch without a CPU-only build on the registry (2.11) brings its CUDA libraries, several GB. pip takes its
# constraints from this target's own file (PIP_CONSTRAINT: the torch asked for), not from a machine-wide pip
# config that may cap torch below the tested range (2.11 to 2.15).
TORCH ?= 2.11.0
TORCH_VENV := .venv-torch-$(TORCH)
TORCH_PIP := PIP_CONSTRAINT=$(TORCH_VENV)/constraints.txt $(TORCH_VENV)/bin/python -m pip install -q --disable-pip-version-check
TORCH_TESTS := tests/training/test_torch_internals.py tests/training/checkpoint tests/training/test_launch_*.py \
        tests/training/test_kit_rendezvous.py tests/training/test_trainer_resume.py tests/training/test_trainer_reshard.py \
        tests/training/test_trainer_inprocess.py tests/training/test_inprocess_restore.py \
        tests/training/test_blame_inprocess.py tests/training/test_hang_interrupt.py tests/training/test_zygote.py \
        tests/training/test_error_file.py
test-torch: ## run the launcher, checkpoint and in-process tests on another torch in its own venv (TORCH=2.11.0)
	@[[ "$(TORCH)" =~ ^[0-9]+\.[0-9]+\.[0-9]+$$ ]] || { echo "error: TORCH='$(TORCH)': expected a release like 2.11.0" >&2; exit 2; }
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	@# the dev lock's pins without torch and without hashes (hash-checking would refuse the torch asked for)
	grep -E '^[A-Za-z0-9]' requirements/dev.txt | sed -e 's/ .*//' -e '/^torch==/d' > $(TORCH_VENV)/requirements-dev.txt
	echo "torch==$(TORCH)" > $(TORCH_VENV)/constraints.txt
	$(TORCH_PIP) torch==$(TORCH) -r $(TORCH_VENV)/requirements-dev.txt
	$(TORCH_PIP) --no-deps -e .
	$(TORCH_VENV)/bin/python -c "import torch; print('make test-torch: torch', torch.__version__)"
	$(TORCH_VENV)/bin/python -m pytest -q -p no:cacheprovider $(TORCH_TESTS)

lint: $(STAMP) ## ruff, hadolint on the trainer image, then cfn-lint and cdk-nag on the synthesized templates
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/hadolint training/Dockerfile
	$(CDK) synth -q -c nag=true
	$(PY) -m fsdpkit.infra.lint cdk.out
	$(PY) -m tools.gen_config_docs --check

synth: $(STAMP) ## synthesize the CloudFormation stacks offline into cdk.out/
	$(CDK) synth -q $(CDK_ARGS)
	@ls cdk.out/*.template.json

diff: $(STAMP) ## compare the stacks with what is deployed (needs AWS credentials)
	$(CDK) diff --all $(CDK_ARGS)

deploy: $(STAMP) ## deploy every stack and write the outputs that train-job reads (needs AWS credentials)
	$(CDK) deploy --all --require-approval broadening --outputs-file $(OUTPUTS) $(CDK_ARGS)

clean: ## remove build outputs (keeps .venv, node_modules and runs/)
	rm -rf cdk.out build .pytest_cache

# --- the locks (requirements/: README.md there says what each holds) -------------------------------------
# pip-compile prefers the versions a lock already pins: LOCK_ARGS=--upgrade (or --upgrade-package NAME) moves
# them. The dev lock resolves with this machine's pip config (torch's CPU build from its find-links folder);
# the image's and the wheel stage's with none (PyPI alone: the CUDA torch and its nvidia-* packages) on the
# image's Python, 3.12.
IMAGE_PYTHON ?= python3.12
LOCK_VENV := build/lock-py3.12
PIP_COMPILE = CUSTOM_COMPILE_COMMAND="make lock" $(1) -m piptools compile -q --generate-hashes --allow-unsafe \
        --strip-extras --no-emit-index-url --no-emit-find-links $(LOCK_ARGS)
PYPI_ONLY := env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null
lock: $(STAMP) ## regenerate the hashed locks in requirements/ from pyproject.toml and requirements/*.in (LOCK_ARGS=--upgrade)
	@$(IMAGE_PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null || { echo "error: IMAGE_PYTHON=$(IMAGE_PYTHON) is not a Python 3.12 (the image's); pass one, e.g. make lock IMAGE_PYTHON=\$$(pyenv prefix 3.12)/bin/python" >&2; exit 2; }
	$(call PIP_COMPILE,$(PY)) --all-extras -o requirements/dev.txt pyproject.toml requirements/dev.in
	test -x $(LOCK_VENV)/bin/python || $(IMAGE_PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	  "pip-tools==$$($(PY) -c 'import importlib.metadata as m; print(m.version("pip-tools"))')"
	$(PYPI_ONLY) $(call PIP_COMPILE,$(LOCK_VENV)/bin/python) --extra hf --extra report -o requirements/image.txt \
	  pyproject.toml requirements/image.in
	$(PYPI_ONLY) $(call PIP_COMPILE,$(LOCK_VENV)/bin/python) -o requirements/build.txt requirements/build.in

# --- the training job on EKS and here (k8s/) ---------------------------------------------------------------
# Command-line variables (NODES=4 MODEL=llama3.1-8b RUN_ID=... DRY_RUN=1 ...) reach the CLI as they are.
# make keeps only the last of `NODES=4 NODES=5`; --make-pid lets the CLI read make's own command line
# (Linux /proc) and refuse the repeat (docs/k8s.md, "Each key once").
train-job: $(STAMP) ## render, validate, apply and follow the training Job (NODES=, SPARES=, MODEL=, RUN_ID=, DRY_RUN=1, OUTPUTS=)
	$(PY) -m fsdpkit.k8s apply --make-pid=$$PPID $(MAKEOVERRIDES)

train-job-status: $(STAMP) ## the run's Job, JobSet or TrainJob and pods (RUN_ID=; all kit jobs without it)
	$(PY) -m fsdpkit.k8s status --make-pid=$$PPID $(MAKEOVERRIDES)

train-job-delete: $(STAMP) ## drain and delete the run's Job (or JobSet, TrainJob and its runtime), pods, rendezvous store, Services, ConfigMap (RUN_ID= required; the run folder stays)
	$(PY) -m fsdpkit.k8s delete --make-pid=$$PPID $(MAKEOVERRIDES)

train-local: $(STAMP) ## run the rendered local-profile Job here as processes, then print the goodput report
	$(PY) -m fsdpkit.k8s local --make-pid=$$PPID $(MAKEOVERRIDES)

# ECR's tags are immutable (infra): each build gets its own tag, the commit (plus the time when the tree has
# uncommitted changes), unless IMAGE_TAG= is given.
BUILD_TAG = $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo build)$(shell git diff --quiet HEAD 2>/dev/null || date -u +-dirty-%Y%m%d%H%M%S)
image: $(STAMP) ## build the trainer image, push it to the ECR output and print its digest: train-job IMAGE=<that> (IMAGE_TAG=; needs Docker + AWS credentials)
	@command -v docker >/dev/null || { echo "error: docker not found; install Docker to build the trainer image" >&2; exit 1; }
	@set -euo pipefail; ref=$$($(PY) -m fsdpkit.k8s image-ref --make-pid=$$PPID $(MAKEOVERRIDES) $(if $(filter IMAGE_TAG=%,$(MAKEOVERRIDES)),,IMAGE_TAG=$(BUILD_TAG))); region=$$($(PY) -m fsdpkit.k8s image-ref --region --make-pid=$$PPID $(MAKEOVERRIDES)); \
	  aws ecr get-login-password --region "$$region" | docker login --username AWS --password-stdin "$${ref%%/*}"; \
	  docker build -f training/Dockerfile -t "$$ref" . && docker push "$$ref"; \
	  digest=$$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$$ref" | grep -m1 -F "$${ref%:*}@sha256:"); \
	  test -n "$$digest" || { echo "error: docker reports no digest for $$ref after the push; run docker push $$ref again" >&2; exit 1; }; \
	  echo "pushed $$digest"; echo "run exactly this image: make train-job IMAGE=$$digest"

# --- operations (ops/) ------------------------------------------------------------------------------------
PREFIX ?= fsdp-kit
teardown: $(STAMP) ## plan the removal of what PREFIX tagged (dry run); delete with ARGS="--yes --confirm PREFIX/ACCOUNT"
	$(PY) -m fsdpkit.ops.teardown --prefix $(PREFIX) $(ARGS)

plan: $(STAMP) ## what a job keeps per recovery mechanism before it is rented (NODES=, MODEL=, SPARES=, REPLICATE=R|auto, ARGS="--json --png p.png")
	$(PY) -m fsdpkit.ops.plan $(if $(NODES),--nodes $(NODES)) $(if $(MODEL),--model $(MODEL)) $(if $(SPARES),--spares $(SPARES)) $(if $(REPLICATE),--replicate $(REPLICATE)) $(ARGS)

cost-report: $(STAMP) ## spend, burn rate and fault cost for PREFIX (ARGS="--period 30d --run-dir DIR --png cost.png")
	$(PY) -m fsdpkit.ops.cost_report --prefix $(PREFIX) $(ARGS)

# --- results and documentation -----------------------------------------------------------------------------
report: $(STAMP) ## metrics table + timeline PNG of a run folder: make report RUN=runs/<id> [PNG=path]
	@test -n "$(RUN)" || { echo "error: pass RUN=<run folder>, e.g. make report RUN=runs/exp-1" >&2; exit 2; }
	$(PY) -m fsdpkit.analysis.report $(RUN) $(if $(PNG),--png $(PNG))

bench: $(STAMP) bench-setup ## every benchmark in bench/ (full mode); rewrites docs/benchmarks.md
	$(PY) -m bench.run_all

bench-quick: $(STAMP) bench-setup ## every benchmark's --quick mode; writes build/benchmarks-quick.md
	$(PY) -m bench.run_all --quick

bench-calibrate: $(STAMP) bench-setup ## measure the plan's phase times: rewrites ops/plan/calibration.json
	$(PY) -m bench.goodput --calibrate
	$(PY) -m bench.scale --nodes 4,8,16,32,64

bench-setup: $(STAMP) ## install the optional competitors (NVRx 0.4.1) for the benchmarks
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-bench.txt

docs-config: $(STAMP) ## regenerate docs/configuration.md from the typed models
	$(PY) -m tools.gen_config_docs
