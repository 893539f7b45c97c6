#!/bin/bash
# cputime.sh TESTBIN ITERATIONS ROUNDS BENCH...
#
# Prints the CPU time per operation of each benchmark BENCH (a -test.bench
# pattern) of TESTBIN: the user + system time of a run of ITERATIONS
# iterations, less that of a 2-iteration run (start-up and set-up: a
# benchmark counting b.N runs its set-up twice, see instructions.sh),
# divided by ITERATIONS - 2; ROUNDS rounds, each benchmark once per round. It counts the
# garbage collector's work on other threads, which wall-clock ns/op does
# not. Needs GNU time (/usr/bin/time).
set -eu
bin=$1 n=$2 rounds=$3
shift 3
[ "$n" -gt 2 ] || { echo "cputime.sh: ITERATIONS must exceed 2" >&2; exit 2; }
cpu() {
	/usr/bin/time -f '%U %S' -o /tmp/cputime.$$ "$bin" -test.run '^$' -test.bench "$1" -test.benchtime "$2" >/dev/null
	awk '{ print $1 + $2 }' /tmp/cputime.$$
}
for r in $(seq 1 "$rounds"); do
	line="round $r:"
	for b in "$@"; do
		two=$(cpu "$b" 2x)
		many=$(cpu "$b" "${n}x")
		line="$line $b $(awk -v a="$many" -v o="$two" -v n="$n" 'BEGIN { printf "%.2f µs", (a - o) * 1e6 / (n - 2) }')"
	done
	echo "$line"
done
rm -f /tmp/cputime.$$
