# pglimit — make help lists the targets. Everything runs from a fresh clone
# with Go and the PostgreSQL server binaries installed: tests and `make run`
# start a throwaway PostgreSQL of their own when DATABASE_URL is not set.

GO        ?= go
# Five modules, one workspace (go.work): the library (.), the reference
# service, the checks, the benchmarks and the tools (./cmd), the gRPC front
# (./grpc), the test kit (./pgtest) and its Docker starter (./pgtestdocker).
PKGS      ?= ./... ./cmd/... ./grpc/... ./pgtest/... ./pgtestdocker/...
# Packages whose tests hammer shared state from many goroutines.
RACE_PKGS ?= ./internal/permit/... ./internal/slots/... ./ban/... ./ratelimit/... ./middleware/... ./housekeeping/... ./internal/housekeep/... ./replica/... ./nodelimit/... ./cursor/... ./grpc/...

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: run
run: ## run the reference service (embedded PostgreSQL unless DATABASE_URL is set) on 127.0.0.1:8080
	$(if $(DATABASE_URL),,$(GO) run ./cmd/installdeps postgresql)
	$(GO) run ./cmd/studio $(ARGS)

.PHONY: test
test: ## install what the tests need when missing (see deps), run every test against a real PostgreSQL, then the race detector on the concurrent packages and a short fuzz
	$(GO) run ./cmd/installdeps
	$(GO) test -count=1 $(PKGS)
	$(GO) test -count=1 -race -short $(RACE_PKGS)
	$(MAKE) --no-print-directory fuzz FUZZTIME=15000x

# Packages whose tests use a database (they import the test kit, pgtest,
# or the harness under it, internal/harness/pgtest); the kit's own tests
# among them, as an adopter's tests run it on their server. (The harness's
# own package is left out: its tests start throwaway clusters of their
# own.)
DB_PKGS = $(shell $(GO) list -f '{{.ImportPath}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}' $(PKGS) | awk '$$1 !~ /internal\/harness\/pgtest$$/ && / github.com\/pglimit\/pglimit\/(internal\/harness\/)?pgtest( |$$)/ {print $$1}')

# installdeps (cmd/installdeps) installs, as root with apt-get, what
# is missing of the PostgreSQL server binaries, chromium and pgbouncer, or
# prints the one line saying what to install and stops the target.
.PHONY: deps
deps: ## install what the tests need beyond Go when missing: PostgreSQL server binaries, chromium, pgbouncer (apt-get as root, else it says what to install)
	$(GO) run ./cmd/installdeps

.PHONY: test-db
test-db: ## run the packages that use a database again on the server DATABASE_URL names (no race detector, no fuzz)
	@test -n "$$DATABASE_URL$$TEST_DATABASE_URL" || { echo "test-db: set DATABASE_URL to a server (a superuser, or a role with LOGIN CREATEDB)"; exit 2; }
	$(GO) test -count=1 $(DB_PKGS)

FUZZTIME ?= 30s
# (a count such as 15000x ends by executions, not by the clock: the short
# run in `make test` takes that form, which a loaded machine cannot turn
# into a spurious "context deadline exceeded" at the end of the time)
.PHONY: fuzz
fuzz: ## fuzz the cursor decoder, the page parser and the client address (FUZZTIME each)
	@for target in $$($(GO) test -list '^Fuzz' ./cursor/ | grep '^Fuzz'); do \
		echo "fuzz $$target $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) ./cursor/ || exit 1; \
	done
	@for target in $$($(GO) test -list '^Fuzz' ./clientaddr/ | grep '^Fuzz'); do \
		echo "fuzz $$target $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) ./clientaddr/ || exit 1; \
	done

.PHONY: generate
generate: ## compile sql/queries (and cmd/studio/sql/queries) into typed Go with sqlc
	$(GO) tool sqlc generate

.PHONY: verify
verify: ## generated code matches the SQL (sqlc diff), every query prepares on a live database (sqlc vet), go.mod tidy and verified
	$(if $(DATABASE_URL),,$(GO) run ./cmd/installdeps postgresql)
	$(GO) tool sqlc diff
	$(GO) run ./cmd/sqlcvet
	$(GO) mod verify
	GO=$(GO) .ci/tidy -check

.PHONY: tidy
tidy: ## go mod tidy every module, the others' requirements of the library (and of one another) left at the commits they name, without a replace (.ci/tidy); go.work follows
	GO=$(GO) .ci/tidy

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@test -z "$$(gofmt -l .)" || { echo "lint: not gofmt'ed:"; gofmt -l .; exit 1; }
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

.PHONY: loadcheck
loadcheck: ## load every limit over 3 replicas for 30 s and judge each with an independent observer (LOADCHECK_ARGS=-duration 10s ...)
	$(GO) run ./cmd/loadcheck $(LOADCHECK_ARGS)

.PHONY: edgecheck
edgecheck: ## rerun the slow-connection attack of issue 42: 20,000 slow connections from one address against a replica while another user reads, judged (EDGE_ARGS=-conns 2000 ...)
	$(GO) run ./cmd/edgecheck $(EDGE_ARGS)

.PHONY: scalecheck-mix
scalecheck-mix: ## the reference service's limits at its default flags for a crowd of cold users and the clients that push each limit, 4 replicas, a replica killed and one joining: the limits' server CPU and statements per request, false refusals, bounds (MIX_ARGS=-steady 0.5 -json ...)
	$(GO) run ./cmd/scalecheck -mix cold $(MIX_ARGS)

.PHONY: scalecheck
scalecheck: ## what one PostgreSQL core sustains, 10 min of churn of the limit tables, and with SCALE_ARGS=-citus the same operations on a Citus cluster, written to docs/scaling.md and docs/scaling-churn.svg (SCALE_ARGS=-duration 1m ...)
	$(GO) run ./cmd/scalecheck -out docs/scaling.md -svg docs/scaling-churn.svg $(SCALE_ARGS)

BENCHTIME  ?= 100ms
BENCH_ARGS ?=
.PHONY: bench
bench: ## run the Go benchmarks briefly (BENCHTIME, -short fixtures), then cmd/benchreport: every path beside SELECT 1, a semaphore and redis_rate at 1 and 16 clients, written to BENCHMARKS.md and docs/bench-latency.svg (BENCH_ARGS=-duration 1s ...)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -short $(PKGS)
	$(GO) run ./cmd/benchreport $(BENCH_ARGS)
