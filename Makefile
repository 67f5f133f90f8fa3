# The README's commands. `make test` is what CI runs (.ci/run).
GO      ?= go
PKGS    ?= ./...
BIN     := bin

.PHONY: test vet build bench clean

build:
	$(GO) build -o $(BIN)/ ./cmd/...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet $(PKGS)

# Every test, against real redis-server / clickhouse-server processes and an
# in-process Kafka-protocol broker that the harness starts on free loopback ports.
test: vet
	$(GO) test -race -count=1 -timeout 25m $(PKGS)

clean:
	rm -rf $(BIN)

# The local stack (scripts/up.sh, scripts/down.sh): Redis, ClickHouse, an
# embedded Kafka-protocol broker, the three services and demo traffic on the
# fixed loopback ports of CONTRACT.md; pids, logs and data under run/.
.PHONY: up down up-test
up:
	@scripts/up.sh

down:
	@scripts/down.sh

# make up, /check traffic, the usage API reports it, make down, nothing left
# behind (on free ports and a temporary run directory; also part of make test).
up-test:
	$(GO) test -count=1 -v -run 'TestUpDown' ./deploy/deploytest/

# Hot keys and scale-out benchmarks (issue 5): starts its own redis-server and
# limiter processes on free loopback ports, drives them with wrk and
# cmd/loadgen, and writes the section "## Hot keys and scale-out" of
# BENCHMARKS.md. WRK_SECONDS / LG_SECONDS shorten it for a smoke run.
bench:
	@bench/run.sh
