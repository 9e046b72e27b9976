# claim-broker: `make demo` and `make test` are the quick start.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JS     := node_modules/.installed

.PHONY: help install demo up test lint bench bench-core bench-quota bench-eta bench-eta-accuracy bench-budget bench-queue bench-allocator bench-publish bench-e2e bench-flood bench-whatif bench-kube chaos clean

help: ## show this help
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-19s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install the broker with its dev tools

$(JS): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $(JS)

demo: $(STAMP) ## run the embedded broker (own nats-server + SQLite), replay the lab workload, print a summary
	$(BIN)/claimbroker demo

up: $(STAMP) ## run the whole broker on the embedded default until Ctrl-C
	$(BIN)/claimbroker up

test: $(STAMP) $(JS) ## start what the tests need (PostgreSQL, Chromium, Biome for the page's JS) and run the whole suite
	@scripts/ensure-postgres.sh
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
	$(BIN)/pytest -q

lint: $(STAMP) $(JS) ## ruff, mypy, the import layers (lint-imports: the core imports no I/O, services not each other), Biome on the usage page
	$(BIN)/ruff check shared services tests bench
	$(BIN)/mypy shared services
	$(BIN)/lint-imports
	node_modules/.bin/biome lint --error-on-warnings

bench: bench-core bench-quota bench-eta bench-budget bench-queue bench-allocator bench-publish ## every benchmark (print JSON lines; not timed tests)

bench-core: $(STAMP) ## decision core: 100, 1,000 and 4,000 nodes, 10,000 mixed claims, one JSON line each
	$(BIN)/python bench/bench_core.py

bench-quota: $(STAMP) ## quotas, fair share, preemption: 1,000 nodes, 100 tenants, queue depth 1,000 and 10,000; then the gang mix
	$(BIN)/python bench/bench_quota.py
	$(BIN)/python bench/bench_quota.py --gang-fraction 0.2 --release-cycles 10

bench-eta: $(STAMP) ## start estimates: 10,000 waiting claims on 1,000 full nodes, CPU seconds cold and again (one JSON line)
	$(BIN)/python bench/bench_eta.py

bench-eta-accuracy: $(STAMP) ## start estimates' accuracy: 1,500 claims on 16 nodes x 8 GPUs at 0.95 load, |actual start - p50| with half annotated and none (two JSON lines)
	$(BIN)/python bench/bench_eta_accuracy.py

bench-budget: $(STAMP) ## placement budget: microseconds per unit, and a cycle beside 16, 50 and 200 claims that exhaust the search
	$(BIN)/python bench/bench_budget.py

bench-queue: $(STAMP) ## allocator's queue read from the ledger (SQLite): depth 1,000 and 10,000, 300 changes a cycle
	$(BIN)/python bench/bench_queue_read.py

bench-allocator: $(STAMP) ## allocator's whole decision transaction (SQLite): depth 1,000 and 10,000, 64 messages each
	$(BIN)/python bench/bench_allocator.py

bench-publish: $(STAMP) ## status publishing: FastStream per message or gathered vs nats-py pipelined, 10,000 messages
	$(BIN)/python bench/publish.py

bench-e2e: $(STAMP) ## claimbroker up end to end (SQLite, PostgreSQL): 10,000-claim burst and churn, claims/s vs an echo service
	@scripts/ensure-postgres.sh
	$(BIN)/python bench/e2e.py

bench-whatif: $(STAMP) ## whatif on 1,000 nodes with 10,000 waiting claims (a drain, a quota raise); what-ifs adding 1,000-20,000 nodes and quota imports of 10,000-100,000 tenants (the admin limits)
	$(BIN)/python bench/whatif.py

bench-flood: $(STAMP) ## a calm tenant's p50/p99 to first status alone, beside a 50,000-claim flood and 200 search bombs (BOMB=0 skips)
	@scripts/ensure-postgres.sh
	$(BIN)/python bench/flood.py --bomb $(or $(BOMB),200)

bench-kube: $(STAMP) ## the cluster path: up --kube on a fake API server, 1,000 ResourceClaims in a burst and at 100/s, claims/s and create-to-status/-written latency
	$(BIN)/python bench/bench_kube.py

chaos: $(STAMP) ## one process per service on PostgreSQL, replicas killed, NATS restarted; invariant counts as JSON
	@scripts/ensure-postgres.sh
	$(BIN)/python bench/chaos.py

clean: ## remove the venv and local data
	rm -rf $(VENV) .claimbroker .pytest_cache node_modules
