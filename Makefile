# Makefile: developer shortcuts. Each target is a thin wrapper around one go command.

BENCHFLAGS ?=

.PHONY: bench
# bench runs the load benchmark (bench/README in the project README, "Performance"):
# upstream, bare ReverseProxy and dedupgw on memory, bolt and redis, interleaved.
# Pass flags with BENCHFLAGS, e.g. make bench BENCHFLAGS=-quick
bench:
	go run ./bench $(BENCHFLAGS)
