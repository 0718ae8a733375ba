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

CHAOSRUN ?= Chaos
FUZZTIME ?= 10s

.PHONY: chaos fuzz
# chaos runs the fault-injection suite in full mode (chaos/doc.go): the real
# binary, built with -race, under kill -9, Redis restarts, SIGTERM and a slowed
# store, thousands of events. Needs redis-server. Pick other tests with
# CHAOSRUN, e.g. make chaos CHAOSRUN=. for the whole suite.
chaos:
	DEDUPGW_CHAOS=full go test -race ./chaos -run '$(CHAOSRUN)' -v -timeout 10m

# fuzz runs every fuzz target (every func Fuzz* in a _test.go file, found
# afresh each run) for FUZZTIME each, one after the other, and stops at the
# first failure (its input is saved under that package's testdata/fuzz).
# E.g. make fuzz FUZZTIME=1m
fuzz:
	@set -e; for pkg in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		for fn in $$(grep -h '^func Fuzz' $$pkg/*_test.go | sed 's/^func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
			echo "fuzz: $$pkg $$fn for $(FUZZTIME)"; \
			go test $$pkg -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME); \
		done; \
	done
