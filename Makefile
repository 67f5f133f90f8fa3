# The README's commands. `make test` is what CI runs (.ci/run).
GO      ?= go
PKGS    ?= ./...
BIN     := bin

.PHONY: check test vet build bench clean deps stress-test

# Go from its standard place when the shell has not put it on PATH yet (a
# fresh machine): the recipes and the tests, which build binaries with
# `go build`, find it there. An earlier go on PATH still wins.
export PATH := $(PATH):/usr/local/go/bin

# Every build and test here (and the binaries the tests build) compiles
# go-control-plane's generated protobuf marshalers, which the limiter's
# gRPC server uses for its answers (internal/vtcodec); a plain `go build`
# works too, with protobuf reflection instead.
export GOFLAGS += -tags=vtprotobuf
# Paths out of the binaries, so that the build cache does not depend on
# where the repository is checked out: a second clone or worktree reuses
# what the first compiled (the tests build each command and link a test
# binary per package; a fresh clone otherwise recompiles every package in
# every configuration).
export GOFLAGS += -trimpath

# A race-built process sleeps a second as it exits (GORACE atexit_sleep_ms,
# time for other threads to finish a report), and the tests start a
# race-built binary for every process they run; a race report still fails
# the run. Set GORACE to keep the sleep.
export GORACE ?= atexit_sleep_ms=0

# Test binaries, and the commands the tests build (GOFLAGS reaches their
# `go build`), link without DWARF: it was over a third of the linker's work
# (cmd/limiter's race-built test binary: 5.1 s of CPU with it, 2.9 s
# without), and stack traces and race reports come from the symbol table,
# which -w keeps. `make build` keeps DWARF for debuggers.
TEST_LINK = GOFLAGS="$(GOFLAGS) -ldflags=-w"

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# The second go vet checks the code built without the vtprotobuf tag;
# it keeps -trimpath, without which a fresh clone recompiled those
# packages for it every time.
vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet $(PKGS)
	GOFLAGS=-trimpath $(GO) vet ./internal/vtcodec ./cmd/limiter
	cd bench && $(GO) vet ./...

# The fast tier, while editing: every unit test, in -short mode, where the
# helpers of testkit/testenv that start a server, a broker or a process
# skip (testenv.SkipShort). It starts nothing and needs nothing installed
# but Go; `make test` runs these tests too.
check:
	$(TEST_LINK) $(GO) test -short -count=1 $(PKGS)
	cd bench && $(TEST_LINK) $(GO) test -short -count=1 ./...

# Every test, against real redis-server / clickhouse-server processes and an
# in-process Kafka-protocol broker that the harness starts on free loopback ports.
# `deps` first, so that on a fresh Debian machine (as root) this is all it takes.
# TEST_P: test binaries run at once. Many of them spend most of their time
# waiting (a fault test's timeouts, a server starting), so more than the
# core count keeps both cores busy.
TEST_P ?= 3
# TEST_TMPDIR: where the tests' scratch files go (the servers' data
# directories, spools, the test binaries go links): /dev/shm when it has
# 8 GB free, since on a disk the kernel's writeback of those files took as
# much CPU time as the servers themselves; else TMPDIR as it is.
TEST_TMPDIR ?= $(shell [ -w /dev/shm ] && [ "$$(df -Pk /dev/shm | awk 'NR==2 {print $$4}')" -gt 8000000 ] && echo /dev/shm || echo "$${TMPDIR:-/tmp}")
test: deps vet test-run

# The test run of make test alone, as CI runs it (no deps, no vet), for
# scripts that repeat it (make flake-hunt): TEST_FLAGS adds go test flags
# (-json), BENCH_PKGS= leaves the bench module out.
TEST_FLAGS ?=
BENCH_PKGS ?= ./...
# The longest packages (docs/testing.md, "Where make test's time goes")
# are named first when PKGS is everything: go test starts packages in the
# order named, and a long one started last would run alone at the end.
TEST_FIRST := ./cmd/limiter ./cmd/meter-consumer ./systemtest/regions ./metering/chsink \
	./deploy/deploytest ./enforcement/redisstore ./cmd/usage-api ./policylog ./metering/consumer \
	./metering/kafkaemit ./schema ./metering/usage ./metering/notify ./metering/reconcile \
	./enforcement/global ./enforcement/slots ./support
.PHONY: test-run
test-run:
	$(TEST_LINK) TMPDIR=$(TEST_TMPDIR) $(GO) test -race -count=1 -p $(TEST_P) -timeout 25m $(TEST_FLAGS) $(if $(filter ./...,$(PKGS)),$(TEST_FIRST)) $(PKGS)
	$(if $(BENCH_PKGS),cd bench && $(TEST_LINK) TMPDIR=$(TEST_TMPDIR) $(GO) test -race -count=1 $(TEST_FLAGS) $(BENCH_PKGS))

# The Debian packages the tests need (scripts/deps.sh installs the missing
# ones with apt-get), and the Go modules, fetched up front with a few retries:
# a proxy hiccup on a fresh machine then fails here, named, instead of as a
# build error in the middle of the test run.
deps:
	@scripts/deps.sh test
	@for i in 1 2 3; do $(GO) mod download && (cd bench && $(GO) mod download) && exit 0; echo "go mod download failed (attempt $$i of 3)" >&2; sleep $$((i * 5)); done; exit 1

# The fault and process tests, STRESS_RUNS times (default 5) while stress-ng
# keeps every core busy, then the hostile-traffic tests (TestHostile*, with
# RATEWARDEN_HOSTILE=1; STRESS_HOSTILE=0 leaves them out); prints
# passed/runs per test and fails unless every test passed every run
# (scripts/stress-test.sh; README, "Testing").
stress-test:
	@scripts/deps.sh test
	@scripts/stress-test.sh

# The whole test run of make test (make test-run: every package, -race,
# -p TEST_P), FLAKE_RUNS times (default 8) in a fresh clone of HEAD beside
# stress-ng --cpu FLAKE_CPUS (default 1); prints each test that failed with
# how often, and fails if any did (scripts/flake-hunt.sh; README, "Testing").
# FLAKE_PKGS narrows the packages for a smoke run.
.PHONY: flake-hunt
flake-hunt:
	@scripts/deps.sh test
	@scripts/flake-hunt.sh

# A soak, not part of `make test`: the broker stopped for SOAK_OUTAGE
# (default 10m) under SOAK_RATE decision events/s (default 5000) through an
# emitter with a disk spool, then back; every event must be in ClickHouse
# exactly once (TestSoakKafkaStoppedWithSpool; docs/spool.md). About
# SOAK_OUTAGE × 1.6 + 2 minutes; `SOAK_OUTAGE=1m make soak-spool` is a smoke run.
SOAK_OUTAGE ?= 10m
SOAK_RATE ?= 5000
.PHONY: soak-spool
soak-spool:
	@scripts/deps.sh
	RATEWARDEN_SOAK_OUTAGE=$(SOAK_OUTAGE) RATEWARDEN_SOAK_RATE=$(SOAK_RATE) $(GO) test -count=1 -timeout 3h -run '^TestSoakKafkaStoppedWithSpool$$' -v ./cmd/meter-consumer

clean:
	rm -rf $(BIN)

# The local stack (scripts/up.sh, scripts/down.sh): Redis, ClickHouse, an
# embedded Kafka-protocol broker, the three services and demo traffic on the
# default loopback ports (docs/reference.md, "Make targets"); pids, logs and
# data under run/.
.PHONY: up down down-clean up-test
up:
	@scripts/up.sh

# make down keeps run/ (the policy log, overrides, decisions, usage);
# down-clean also deletes it: the next make up starts from nothing.
down:
	@scripts/down.sh

down-clean:
	@scripts/down.sh --clean

# make up, /check traffic, the usage API reports it, make down, nothing left
# behind (on free ports and a temporary run directory; also part of make test).
up-test:
	$(GO) test -count=1 -v -run 'TestUpDown' ./deploy/deploytest/

# The benchmarks. First /check against the HTTP floor (bench/floor.sh:
# throughput and fixed-rate latency interleaved with the floor, the local
# tier's rejection; prints the ratios in one table and writes "## /check
# against the HTTP floor" of BENCHMARKS.md), then hot keys and scale-out
# (bench/run.sh: "## Hot keys and scale-out"). Each starts its own redis-server, limiter and floor processes on free loopback
# ports. WRK_SECONDS / LAT_SECONDS / LG_SECONDS shorten them for a smoke run.
.PHONY: bench-floor
bench: bench-floor
	@bench/run.sh

bench-floor:
	@bench/floor.sh

# The same /check table for two revisions of the limiter, interleaved pass
# by pass (bench/compare.sh): make bench-compare BASE=<rev> [HEAD=<rev>].
.PHONY: bench-compare
bench-compare:
	@BASE="$(BASE)" HEAD="$(or $(HEAD),HEAD)" bench/compare.sh

# Billing's targets (docs/billing.md, "Measured"): the statement of a key
# with BILLING_BENCH_RAW_ROWS raw rows in its month (default 10^7; the goals
# are set for 10^8, which needs ~10 GB free under BENCH_TMPDIR) and its
# verify, each printed beside its goal.
.PHONY: bench-billing
bench-billing:
	TMPDIR=$(or $(BENCH_TMPDIR),/tmp) $(GO) test -count=1 -run '^$$' -bench BenchmarkStatement -benchtime 100x -timeout 60m ./metering/billing/chstore/

# The multi-region test bed (scripts/regions-*.sh; docs/regions-testbed.md):
# regions a, b, c, each its own redis-server and a limiter (18080, 28080,
# 38080), the WAN between them through wan-dev (15/40/75 ms one-way, 10%
# jitter), the demo policy deploy/regions-policy.yaml; pids and logs under
# run/regions/. regions-cut / regions-heal REGION=b cut every link of a
# region or heal them; regions-down stops exactly what regions-up started.
.PHONY: regions-up regions-down regions-cut regions-heal
regions-up:
	@scripts/regions-up.sh

regions-down:
	@scripts/regions-down.sh

regions-cut:
	@scripts/regions-cut.sh cut "$(REGION)"

regions-heal:
	@scripts/regions-cut.sh heal "$(REGION)"
