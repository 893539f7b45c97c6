#!/bin/bash
# instructions.sh TESTBIN ITERATIONS BENCH...
#
# Prints the instructions executed per operation of each benchmark BENCH (a
# -test.bench pattern matching one benchmark) of TESTBIN, counted by
# valgrind's callgrind: those of an ITERATIONS-iteration run less those of a
# 1-iteration run (start-up and set-up), divided by ITERATIONS. The count is
# deterministic to about 0.5 %, so it compares code on a machine too busy
# for timing; it is not time (a cache miss or a system call's kernel work
# counts as little or nothing). It runs with one processor
# (GOMAXPROCS=1: an idle processor's search for work would count too) and
# without the garbage collector (GOGC=off: whether a run holds one more
# collection would move the count more than most changes do; the allocs/op
# and B/op it prints show what the collector would have to do), and
# GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off, which valgrind needs
# (valgrind 3.19 does not know the RDTSCP instruction of Go 1.26's runtime). Build TESTBIN with
# CGO_ENABLED=0. About 50 times slower than a normal run.
#
#   CGO_ENABLED=0 go test -c -o /tmp/core.test ./internal/integration/core
#   cd internal/integration/core && ../../../scripts/bench/instructions.sh /tmp/core.test 2000 \
#       'BenchmarkEncryption/^memory$/^plain$/^replay$' 'BenchmarkEncryption/^memory$/^sealed$/^replay$'
set -eu
bin=$1 n=$2
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
count() {
	GOMAXPROCS=1 GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind --callgrind-out-file=/dev/null \
		"$bin" -test.run '^$' -test.bench "$1" -test.benchtime "$2x" -test.benchmem >"$out" 2>&1
	awk '/Collected :/ { c = $NF }
		/^Bench/ { for (i = 3; i < NF; i++) { if ($(i + 1) == "B/op") b = $i; if ($(i + 1) == "allocs/op") a = $i } }
		END { printf "%.0f %s %s\n", c, b, a }' "$out"
}
for b in "$@"; do
	one=$(count "$b" 1)
	many=$(count "$b" "$n")
	echo "$many ${one%% *}" | awk -v b="$b" -v n="$n" '{ printf "%s: %.0f instructions/op, %s B/op, %s allocs/op\n", b, ($1 - $4) / n, $2, $3 }'
done
