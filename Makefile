# Makefile: developer shortcuts. Each target is a thin wrapper around one go command.

BENCHFLAGS ?=

.PHONY: bench
# bench runs the load benchmark (README, "Performance"): the upstream app,
# a bare ReverseProxy, nginx if installed and dedupgw on memory, bolt and redis, interleaved.
# Pass flags with BENCHFLAGS, e.g. make bench BENCHFLAGS=-quick
bench:
	go run ./bench $(BENCHFLAGS)

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: build test run validate
# build writes bin/dedupgw with the version stamped (dedupgw version, dedupgw_build_info).
build:
	go build -ldflags "-X main.version=$(VERSION)" -o bin/dedupgw ./cmd/dedupgw

# test is the README's test command, the one CI runs (.ci/run).
test:
	go vet ./... && go test -race ./...

# run starts the gateway on the example configuration (bbolt in ./dedupgw.db).
run:
	go run ./cmd/dedupgw serve --config config.example.yaml

# validate checks the example configuration.
validate:
	go run ./cmd/dedupgw validate --config config.example.yaml
