#!/bin/bash
# ratio.sh TESTBIN ROUNDS BENCHTIME BASE OTHER...
#
# Runs the benchmarks BASE and OTHER... of the test binary TESTBIN in
# interleaved rounds (each once per round, for BENCHTIME) and prints, for
# each OTHER, the median over the rounds of its throughput relative to
# BASE's in the same round, ns/op(BASE) / ns/op(OTHER), and every round's
# ratio. Above 1 means OTHER is faster.
#
#   go test -c -o /tmp/idem.test .
#   scripts/bench/ratio.sh /tmp/idem.test 8 1s '^BenchmarkRawPGReplay$/^with_handler$' '^BenchmarkMiddlewarePGReplay$'
set -eu
bin=$1 rounds=$2 benchtime=$3 base=$4
shift 4
for r in $(seq 1 "$rounds"); do
	for b in "$base" "$@"; do
		"$bin" -test.run '^$' -test.bench "$b" -test.benchtime "$benchtime" -test.benchmem |
			awk -v b="$b" -v r="$r" '/^Bench/ { print r, b, $3, $7 }'
	done
done | awk -v base="$base" '
function median(a, n) { asort(a); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
{ ns[$1 "," $2] = $3; allocs[$2] = $4; names[$2] = 1; rounds[$1] = 1 }
END {
	k = 0
	for (r in rounds) bv[++k] = ns[r "," base]
	printf "%s: median %.0f ns/op, %s allocs/op\n", base, median(bv, k), allocs[base]
	for (n in names) {
		if (n == base) continue
		k = 0; s = ""
		for (r = 1; r in rounds; r++) { q = ns[r "," base] / ns[r "," n]; d[++k] = q; v[k] = ns[r "," n]; s = s sprintf(" %.2f", q) }
		printf "%s: median %.0f ns/op, %s allocs/op; throughput vs base: median %.2f, rounds%s\n",
			n, median(v, k), allocs[n], median(d, k), s
		delete d; delete v
	}
}'
