# hotledger: the two commands are `make up` (set up and serve locally) and `make test` (the whole suite).
# `make help` lists every target from its `##` comment.
SHELL := /bin/bash
PY := .venv/bin/python
export PYTHONPATH := functions:.
export SAM_CLI_TELEMETRY := 0

.PHONY: help up up-cluster setup tools services migrate serve token test test-unit test-cluster mutants lock lint docs build deploy destroy bench bench-smoke down clean resolve-dead-letters ops typecheck

## list the targets with what each does
help:
	@awk '/^## /{doc = doc (doc ? " " : "") substr($$0, 4); next} /^[a-z][a-z-]*:/{if (doc) {split($$0, t, ":"); printf "  %-22s %s\n", t[1], doc}; doc = ""; next} {doc = ""}' $(MAKEFILE_LIST)

## set up and serve in the foreground until Ctrl-C: API on :3000, the writer's pollers, the scheduled functions
up: setup services migrate serve

## install what serving needs when missing: apt packages (root or sudo), the project venv .venv
setup:
	bash infra/setup.sh

## the SAM CLI in its own venv .tools (build, deploy, lint, destroy and the template tests need it)
tools:
	bash infra/install_sam.sh

## start Redis, MariaDB and the Kafka-protocol broker when they are not reachable; create the topic
services:
	$(PY) infra/services.py up

## apply the schema migrations (idempotent)
migrate:
	$(PY) infra/migrate.py

CLUSTER_URL := redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005
## the same service on a local Redis Cluster: 3 masters with one replica each on 127.0.0.1:7000-7005, API on :3000
up-cluster: setup
	$(PY) infra/services.py up-cluster
	$(PY) infra/migrate.py
	REDIS_URL=$(CLUSTER_URL) $(PY) -m infra.localrt.runtime --port $${PORT:-3000}

## the local runtime alone, in the foreground (Ctrl-C stops it); PORT=3000 by default
serve:
	$(PY) -m infra.localrt.runtime --port $${PORT:-3000}

## a local dev issuer token on stdout, one line: SCOPES="service admin" (backend, operator) or SUB=<account id> (end user)
token:
	@$(PY) -m infra.dev_issuer $(if $(SUB),--sub '$(SUB)') $(if $(SCOPES),--scopes '$(SCOPES)')

## the whole suite: make lint (ruff, the template), then sam build, Lua, handlers, writer, reconciler, e2e over HTTP,
## faults, the bench's smoke pass (make bench-smoke); then the cluster subset (below) again on a private Redis Cluster
test: setup tools services lint
	$(PY) -m pytest
	$(CLUSTER_RUN)

## on a private 3-master Redis Cluster (one replica each) per run: CLUSTER_RUN (tests/integration and tests/e2e, about
## 4 + 5 minutes; also in `make test`) then the failover test (which makes its own cluster, so it runs in `make test` too). Left out by
## design, not skipped: tests marked single_redis (they stop, restart or proxy the one Redis process), the other
## tests/faults (each starts its own single Redis), the template tests (no Redis) and the bench's smoke pass (its
## servers are its own)
CLUSTER_RUN := HOTLEDGER_TEST_REDIS=cluster $(PY) -m pytest -m "not single_redis" tests/integration tests/e2e \
	--ignore=tests/integration/test_template.py --ignore=tests/integration/test_sam_local_invoke.py \
	--ignore=tests/integration/test_bench_smoke.py
## the cluster run alone (CLUSTER_RUN above), then the failover and node-loss tests
test-cluster: setup services
	$(CLUSTER_RUN) tests/faults/test_cluster_failover.py tests/faults/test_cluster_node_loss.py

## the operators' console: dead letters and their replays, an account in Redis vs the DB, the reconciler's parts, the
## operators' log, key rotations (ARGS="--help"; ARGS="--stack hotledger-dev ..." against a deployed stack)
ops: setup
	@$(PY) -m infra.ops $(ARGS)

## after replaying the writer's dead-letter topic (<topic>.dead-letter): mark its records resolved, so vouchers and
## red packets rebuilt after a Redis loss sell again (they stay RECOVERING while an unresolved dead letter exists)
resolve-dead-letters: setup
	$(PY) -c 'from hotledger.runtime import log_hold; print("resolved up to", log_hold().resolve_dead_letters())'

## the unit tests alone (tests/unit): no Redis, DB or broker needed, well under a minute
test-unit: setup
	$(PY) -m pytest tests/unit

## mutation pass (not part of `make test`): each one-line mutant of a money/stock invariant (infra/mutants.py) is
## applied to a scratch copy and its narrow tests run; fails on any survivor. Minutes; ONLY=<id> runs one.
mutants: setup services
	$(PY) infra/mutants.py $(if $(ONLY),--only $(ONLY))

## the locks with hashes, from requirements-dev.txt (this machine's Python) and functions/requirements.txt (the layer:
## python3.13 on arm64); every install reads them (infra/setup.sh, sam build)
lock: setup
	.venv/bin/uv pip compile requirements-dev.txt --python-version 3.11 --generate-hashes --no-header -q -o requirements-dev.lock
	.venv/bin/uv pip compile functions/requirements.txt --python-version 3.13 --python-platform aarch64-manylinux_2_28 \
	  --generate-hashes --no-header -q -o functions/requirements.lock

## mypy --strict over the functions' code (mypy.ini); make lint runs it
typecheck: setup
	.venv/bin/mypy functions/hotledger functions/api functions/authorizer functions/writer functions/reconciler \
	  functions/delay_drainer functions/stream_drainer functions/webhook_sender functions/webhook_poster functions/setup

## lint: ruff (lint and format check, ruff.toml) over the Python code, mypy --strict over functions/, then the
## template (cfn-lint, sam validate)
lint: setup tools typecheck
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/cfn-lint --include-checks I -- template.yaml
	AWS_DEFAULT_REGION=us-east-1 .tools/bin/sam validate --lint

## build: the functions' code, one dependencies layer cross-built for python3.13 arm64 (functions/Makefile)
build: setup tools
	PATH="$(CURDIR)/.tools/bin:$$PATH" .tools/bin/sam build

ENV ?= dev
## deploy to AWS: ENV=dev (default) or prod (samconfig.toml); guided the first time an environment is deployed
deploy: build
	@if .tools/bin/sam list stack-outputs --stack-name hotledger-$(ENV) >/dev/null 2>&1; then \
	  .tools/bin/sam deploy --config-env $(ENV); \
	else \
	  .tools/bin/sam deploy --guided --config-env $(ENV); \
	fi

## benchmarks (figures, never assertions): writes bench/results.json (each figure's unit, samples and baseline; the
## commit and the machine's load) and PNG charts beside it; a progress line per stage on stderr. QUICK=1: a few minutes
bench: setup services
	$(PY) bench/run.py $(if $(QUICK),--quick)

## every bench stage once at a tiny size (seconds each), each on a Redis, schema and topic of its own: no target judged,
## the figures in .state/bench-smoke/ (bench/results.json untouched); fails when a stage does. `make test` runs it
## (tests/integration/test_bench_smoke.py)
bench-smoke: setup services
	$(PY) bench/run.py --smoke

## tear the stack hotledger-$(ENV) down (sam delete; asks first). Redis and Aurora leave final snapshots and the
## secrets, the user pool and the API Gateway logging role stay, by their DeletionPolicy (docs/operations.md)
destroy: tools
	.tools/bin/sam delete --stack-name hotledger-$(ENV)

## regenerate the generated tables of docs/ (routes, error codes, settings) from the code
docs: setup
	$(PY) infra/gen_docs.py

## stop the local servers `make up` started
down:
	$(PY) infra/services.py down

## remove build output and local state (.aws-sam, .state)
clean:
	rm -rf .aws-sam .state
