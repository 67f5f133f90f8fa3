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
