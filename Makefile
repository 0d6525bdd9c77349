# hotledger: the two commands are `make up` (set up and serve locally) and `make test` (the whole suite).
SHELL := /bin/bash
PY := .venv/bin/python
export PYTHONPATH := functions:.
export SAM_CLI_TELEMETRY := 0

.PHONY: up setup services migrate serve test test-unit mutants lint bench down clean

## set everything up and run the service: API on :3000, the MSK-triggered writer, the scheduled reconciler
up: setup services migrate serve

## install what is missing: apt packages, .venv, the SAM CLI (.tools)
setup:
	bash infra/setup.sh

## start Redis, MariaDB and the Kafka-protocol broker when they are not reachable; create the topic
services:
	$(PY) infra/services.py up

migrate:
	$(PY) infra/migrate.py

serve:
	$(PY) -m infra.localrt.runtime --port $${PORT:-3000}

## the whole suite: template lint + sam build, Lua, handlers, writer, reconciler, e2e over HTTP, faults
test: setup services
	$(PY) -m pytest

## the unit tests alone (tests/unit): no Redis, DB or broker needed, well under a minute
test-unit: setup
	$(PY) -m pytest tests/unit

## mutation pass (not part of `make test`): each one-line mutant of a money/stock invariant (infra/mutants.py) is
## applied to a scratch copy and its narrow tests run; fails on any survivor. Minutes; ONLY=<id> runs one.
mutants: setup services
	$(PY) infra/mutants.py $(if $(ONLY),--only $(ONLY))

lint:
	.venv/bin/cfn-lint template.yaml
	AWS_DEFAULT_REGION=us-east-1 .tools/bin/sam validate --lint

## benchmarks (figures, not assertions): writes bench/results.json
bench: setup services
	$(PY) bench/run.py

down:
	$(PY) infra/services.py down

clean:
	rm -rf .aws-sam .state
