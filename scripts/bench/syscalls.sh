#!/bin/bash
# syscalls.sh TESTBIN ITERATIONS BENCH
#
# Prints the system calls and context switches per operation of the
# benchmark BENCH (a -test.bench pattern matching one benchmark) of TESTBIN:
# those of an ITERATIONS-iteration run less those of a 1-iteration run
# (start-up and set-up), divided by ITERATIONS. System calls are counted by
# strace -c -f (every thread), by name; context switches by perf stat's
# software event context-switches (every thread; the kernel's count, so a
# goroutine switch that stays on its thread is not one). Neither moves much
# with the machine's load, though strace slows every call and so can change
# how calls overlap: compare runs of this script with each other, not with
# timings. GOMAXPROCS and IDEM_BENCH_PARALLELISM (benchkit.Parallelism)
# pass through, so that
#
#   GOMAXPROCS=2 IDEM_BENCH_PARALLELISM=8 scripts/bench/syscalls.sh /tmp/pg.test 5000 '^BenchmarkMiddlewarePGNewKeyGroupCommit$'
#
# counts 16 requests in flight on two processors (run it in the package's
# directory, or wherever the benchmark expects to be).
set -eu
bin=$1 n=$2 bench=$3
out=$(mktemp)
trap 'rm -f "$out" "$out".*' EXIT
# run ITERATIONS: prints "name calls errors" lines, then "ctxsw N".
run() {
	strace -f -c -o "$out.strace" "$bin" -test.run '^$' -test.bench "$bench" -test.benchtime "$1x" >"$out.bench" 2>&1
	awk '$1 ~ /^[0-9.]+$/ && NF >= 5 { print $NF, $4, (NF == 6 ? $5 : 0) }' "$out.strace"
	perf stat -x, -e context-switches -o "$out.perf" "$bin" -test.run '^$' -test.bench "$bench" -test.benchtime "$1x" >/dev/null 2>&1
	awk -F, '$3 == "context-switches" { print "ctxsw", $1 }' "$out.perf"
}
run 1 >"$out.one"
run "$n" >"$out.many"
echo "$bench, $n iterations, per op (calls, failed calls):"
awk -v n="$n" '
	NR == FNR { one[$1] = $2; oneerr[$1] = $3; next }
	{ many[$1] = $2; err[$1] = $3 }
	END {
		for (k in many) {
			d = (many[k] - one[k]) / n; e = (err[k] - oneerr[k]) / n
			if (k == "ctxsw") printf "  %-16s %8.3f\n", "ctxsw", d
			else if (k == "total") printf "  %-16s %8.3f %8.3f\n", "syscalls", d, e
			else if (d >= 0.005 || d <= -0.005) printf "  %-16s %8.3f %8.3f\n", k, d, e
		}
	}' "$out.one" "$out.many" | sort -k2,2nr
