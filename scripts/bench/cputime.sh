#!/bin/bash
# cputime.sh TESTBIN ITERATIONS ROUNDS BENCH...
#
# Prints the CPU time per operation of each benchmark BENCH (a -test.bench
# pattern) of TESTBIN: the user + system time of a run of ITERATIONS
# iterations, less that of a 1-iteration run (start-up and set-up), divided
# by ITERATIONS; ROUNDS rounds, each benchmark once per round. It counts the
# garbage collector's work on other threads, which wall-clock ns/op does
# not. Needs GNU time (/usr/bin/time).
set -eu
bin=$1 n=$2 rounds=$3
shift 3
cpu() {
	/usr/bin/time -f '%U %S' -o /tmp/cputime.$$ "$bin" -test.run '^$' -test.bench "$1" -test.benchtime "$2" >/dev/null
	awk '{ print $1 + $2 }' /tmp/cputime.$$
}
for r in $(seq 1 "$rounds"); do
	line="round $r:"
	for b in "$@"; do
		one=$(cpu "$b" 1x)
		many=$(cpu "$b" "${n}x")
		line="$line $b $(awk -v a="$many" -v o="$one" -v n="$n" 'BEGIN { printf "%.2f µs", (a - o) * 1e6 / n }')"
	done
	echo "$line"
done
rm -f /tmp/cputime.$$
