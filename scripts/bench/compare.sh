#!/bin/bash
# compare.sh diff|ratio TESTBIN ROUNDS BENCHTIME BASE OTHER...
#
# Runs the benchmarks BASE and OTHER... of the test binary TESTBIN in
# interleaved rounds: each once per round, for BENCHTIME, one after the
# other, so that every pair sees the same load. BASE and OTHER are
# -test.bench patterns that match one benchmark each. For each OTHER it
# prints its median ns/op and allocs/op, and
#
#   diff:  the median over the rounds of ns/op(OTHER) − ns/op(BASE), with
#          the smallest and largest round;
#   ratio: the median over the rounds of OTHER's throughput relative to
#          BASE's, ns/op(BASE) / ns/op(OTHER), and every round's ratio
#          (above 1: OTHER is faster).
#
#   go test -c -o /tmp/idem.test .
#   scripts/bench/compare.sh diff /tmp/idem.test 15 0.4s '^BenchmarkBare$' '^BenchmarkMiddleware$/^memory/replay$'
#   scripts/bench/compare.sh ratio /tmp/idem.test 12 1s '^BenchmarkRawPGReplay$/^with_handler$' '^BenchmarkMiddlewarePGReplay$'
set -eu
mode=$1 bin=$2 rounds=$3 benchtime=$4 base=$5
shift 5
case $mode in diff | ratio) ;; *) echo "compare.sh: mode must be diff or ratio" >&2; exit 2 ;; esac
for r in $(seq 1 "$rounds"); do
	for b in "$base" "$@"; do
		"$bin" -test.run '^$' -test.bench "$b" -test.benchtime "$benchtime" -test.benchmem |
			awk -v b="$b" -v r="$r" '/^Bench/ { print r, b, $3, $7 }'
	done
done | awk -v base="$base" -v mode="$mode" '
function median(a, n) { asort(a); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
{ ns[$1 "," $2] = $3; allocs[$2] = $4; names[$2] = 1; rounds[$1] = 1 }
END {
	k = 0
	for (r in rounds) bv[++k] = ns[r "," base]
	printf "%s: median %.0f ns/op, %s allocs/op\n", base, median(bv, k), allocs[base]
	for (n in names) {
		if (n == base) continue
		k = 0; s = ""
		for (r = 1; r in rounds; r++) {
			d[++k] = mode == "diff" ? ns[r "," n] - ns[r "," base] : ns[r "," base] / ns[r "," n]
			v[k] = ns[r "," n]
			s = s sprintf(mode == "diff" ? " %.0f" : " %.2f", d[k])
		}
		printf "%s: median %.0f ns/op, %s allocs/op; %s: median %s, rounds%s\n", n, median(v, k), allocs[n],
			mode == "diff" ? "minus base (ns)" : "throughput vs base", sprintf(mode == "diff" ? "%.0f" : "%.2f", median(d, k)), s
		delete d; delete v
	}
}'
