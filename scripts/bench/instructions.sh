#!/bin/bash
# instructions.sh TESTBIN ITERATIONS BENCH...
#
# Prints the instructions executed per operation of each benchmark BENCH (a
# -test.bench pattern matching one benchmark) of TESTBIN, counted by
# valgrind's callgrind: those of an ITERATIONS-iteration run less those of a
# 2-iteration run (start-up and set-up), divided by ITERATIONS - 2. Two, not
# one: with -benchtime Nx a benchmark that counts b.N runs once with N=1 and
# then, when N > 1, again with N (its set-up twice), and a 1-iteration
# baseline would leave one set-up in the count (a SQLite store's opening
# and migrations, some 21 million instructions, added 10,700 a key to
# idemsqlite's NewKeyParallel at 2,000 iterations and 75,000 a request to
# BenchmarkEncryption's SQLite new key at 300). One using b.Loop runs once,
# so either baseline holds its set-up once. ITERATIONS must exceed 2. The
# count is deterministic to about 0.5 %, so it compares code on a machine too busy
# for timing; it is not time (a cache miss or a system call's kernel work
# counts as little or nothing). It runs with one processor
# (GOMAXPROCS=1: an idle processor's search for work would count too) and
# without the garbage collector (GOGC=off: whether a run holds one more
# collection would move the count more than most changes do; the allocs/op
# and B/op it prints show what the collector would have to do), and
# GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off, which valgrind needs (its
# amd64 decoder lacks RDTSCP, which Go 1.26's runtime.cputicks executes
# where the CPU has it). Build TESTBIN with
# CGO_ENABLED=0. About 50 times slower than a normal run.
#
#   CGO_ENABLED=0 go test -c -o /tmp/core.test ./internal/integration/core
#   cd internal/integration/core && ../../../scripts/bench/instructions.sh /tmp/core.test 2000 \
#       'BenchmarkEncryption/^memory$/^plain$/^replay$' 'BenchmarkEncryption/^memory$/^sealed$/^replay$'
set -eu
bin=$1 n=$2
shift 2
[ "$n" -gt 2 ] || { echo "instructions.sh: ITERATIONS must exceed 2" >&2; exit 2; }
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
	two=$(count "$b" 2)
	many=$(count "$b" "$n")
	echo "$many ${two%% *}" | awk -v b="$b" -v n="$n" '{ printf "%s: %.0f instructions/op, %s B/op, %s allocs/op\n", b, ($1 - $4) / (n - 2), $2, $3 }'
done
