# parity — build, test and run against the real test environment (scripts/env).
SHELL := /bin/bash
.DEFAULT_GOAL := build

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
GO      ?= go
PLATFORMS ?= linux/amd64 linux/arm64
# Every test run reads the servers from var/env.sh (written by `scripts/env up`).
ENV     := set -a; [ -f var/env.sh ] && . var/env.sh; set +a;
FUZZTIME ?= 60s
FUZZTIME_OTHERS ?= 10s
SEEDS ?= 300
SOAK_DURATION ?= 30m
PROTOCOL ?= open-protocol

.PHONY: build
build: ## build bin/parity
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/parity ./cmd/parity

.PHONY: env-up env-down env-status
env-up: ## start Kafka, both MariaDB servers and TiDB on loopback (installs what is missing)
	scripts/env up
env-down: ## stop exactly what env-up started
	scripts/env down
env-status:
	scripts/env status

.PHONY: release
release: ## static binaries for linux/amd64 and linux/arm64 in dist/, with SHA256SUMS
	rm -rf dist && mkdir -p dist
	for p in $(PLATFORMS); do \
		CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -ldflags "$(LDFLAGS) -s -w" \
			-o dist/parity-$(VERSION)-$${p%/*}-$${p#*/} ./cmd/parity || exit 1; \
	done
	cd dist && sha256sum parity-* > SHA256SUMS

.PHONY: test
test: env-up build check-generated release ## the whole suite: environment up, generated code current, unit + integration tests with -race, fuzzing, deploy files
	$(ENV) $(GO) test -race -count=1 -timeout 45m ./...
	@echo "== allocation pins (the race detector allocates: these files build without it)"
	$(GO) test -count=1 -run='Allocations$$' ./cdc/...
	$(ENV) cd deploy && PARITY_BIN=../bin/parity PARITY_DIST=../dist $(GO) test -count=1 ./...
	FUZZTIME=$(FUZZTIME) FUZZTIME_OTHERS=$(FUZZTIME_OTHERS) scripts/fuzz.sh

.PHONY: test-unit
test-unit: ## unit tests only (integration tests skip without the environment)
	env -u CI -u PARITY_TEST_UPSTREAM_DSN -u PARITY_TEST_DOWNSTREAM_DSN -u PARITY_TEST_MYSQL_DSN -u PARITY_TEST_KAFKA \
		-u PARITY_TEST_TLS_DIR -u PARITY_TEST_TLS_MYSQL_DSN -u PARITY_TEST_TLS_MYSQL_X509_DSN -u PARITY_TEST_TLS_TIDB_DSN \
		-u PARITY_TEST_TLS_KAFKA_SSL -u PARITY_TEST_TLS_KAFKA_SASL_SSL \
		PARITY_TEST_NO_ENV_FILE=1 $(GO) test -race -count=1 ./...

.PHONY: fuzz
fuzz: ## every fuzz target: the decoder for FUZZTIME, the others for FUZZTIME_OTHERS (e.g. make fuzz FUZZTIME=10m FUZZTIME_OTHERS=2m)
	FUZZTIME=$(FUZZTIME) FUZZTIME_OTHERS=$(FUZZTIME_OTHERS) scripts/fuzz.sh

.PHONY: soak
soak: env-up ## the randomized differential diff test over many seeds (SEEDS=300 by default; make test runs 6), then soak-serve
	$(ENV) PARITY_RANDOM_SEEDS=$(SEEDS) $(GO) test -count=1 -timeout 3h -run '^TestRandomDiff' ./checker/
	$(MAKE) soak-serve

.PHONY: soak-serve
soak-serve: env-up ## parity serve with continuous verification at a steady load for SOAK_DURATION (30m): RSS, goroutines, fds, connections and lag every minute; fails on unbounded growth (make test runs 3 minutes)
	@mkdir -p var
	set -o pipefail; $(ENV) PARITY_SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -timeout 0 -v -run '^TestSoakServe$$' ./internal/reliability/ | tee var/soak-serve.log | grep -E 'soak_test|^(---|ok|FAIL|PASS)'; \
		rc=$$?; echo "the whole output, with parity serve's log on a failure: var/soak-serve.log"; exit $$rc

.PHONY: bench
bench: env-up build ## performance targets, each printed against its baseline (25-35 minutes)
	@echo "== open-protocol decoder: MB/s and events/s, ratio against encoding/json"
	$(ENV) $(GO) test -run='^$$' -bench=. -benchmem ./cdc/open/
	@echo "== canal-json and simple decoders (TiCDC-made corpora): MB/s beside the open protocol's"
	$(GO) test -run='^$$' -bench='^BenchmarkDecode$$' -benchmem ./cdc/canal/ ./cdc/simple/
	@echo "== the three protocols on TiCDC-made changefeeds of the same random workload, one core: MB/s and events/s against the open protocol's"
	GOMAXPROCS=1 $(GO) test -run='^$$' -bench='^BenchmarkDecodeProtocols$$' -benchmem ./cdc/
	@echo "== applier: rows/s against raw multi-row INSERTs, p99 lag at 5,000 rows/s"
	$(ENV) $(GO) test -run='^$$' -bench='^BenchmarkApplier' -benchtime=1x -timeout=60m ./cdc/e2e/
	@echo "== verification: applier pause per snapshot pair at 5,000 rows/s; freshness with continuous verification every 30s"
	$(ENV) $(GO) test -run='^$$' -bench='^BenchmarkVerify(Pause|Freshness)$$' -benchtime=1x -timeout=15m ./cmd/parity/
	@echo "== fleet: four members after writes stopped; the fleet point's pause (slowest member) and the fleet cutover check against the slowest single member's (target <= 1.25)"
	$(ENV) $(GO) test -run='^$$' -bench='^BenchmarkFleetCutover$$' -benchtime=1x -timeout=20m ./cmd/parity/
	@echo "== routing: the collation-aware key of a row, per key shape, against hashing its bytes"
	$(GO) test -run='^$$' -bench='^BenchmarkRouteKey$$' -benchtime=500000x ./cdc/
	@echo "== diff: parity against reladiff and the bare checksum loop, 1,000,000 rows; then a cdc-scoped diff of 100,000 dirty keys (target <= 5 s, with its RSS)"
	$(ENV) $(GO) run ./scripts/bench/diffbench -parity bin/parity -repeat 2

.PHONY: dashboards
dashboards: ## regenerate dashboards/*.json from dashboards/dashboards.go
	$(GO) test -count=1 -run '^TestFilesAreGenerated$$' ./dashboards -update

.PHONY: lint
lint: ## go vet, gofmt
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: generate check-generated
generate: ## regenerate generated code (protobuf: protoc from Debian's protobuf-compiler, generators pinned in scripts/protoc)
	$(GO) generate ./...
check-generated: ## fail when committed generated code differs from what make generate writes
	scripts/protoc/generate.sh --check

.PHONY: demo
demo: env-up build ## start the environment and show parity at work (PROTOCOL=canal-json or simple: the changefeed's protocol)
	DEMO_PROTOCOL=$(PROTOCOL) scripts/demo.sh

.PHONY: clean
clean:
	rm -rf bin dist
