#!/bin/bash
# diff.sh TESTBIN ROUNDS BASE OTHER...
#
# Runs the benchmarks BASE and OTHER... of the test binary TESTBIN in
# interleaved rounds (each once per round, 0.4 s each, seconds apart, so
# that every pair sees the same load) and prints, for each OTHER, its median
# ns/op and the median over the rounds of (OTHER − BASE) in ns/op, with the
# smallest and largest round. BASE and OTHER are -test.bench patterns that
# match one benchmark each.
#
#   go test -c -o /tmp/idem.test .
#   scripts/bench/diff.sh /tmp/idem.test 11 '^BenchmarkBare$' '^BenchmarkMiddleware$/^memory/replay$'
set -eu
bin=$1 rounds=$2 base=$3
shift 3
for r in $(seq 1 "$rounds"); do
	for b in "$base" "$@"; do
		"$bin" -test.run '^$' -test.bench "$b" -test.benchtime 0.4s -test.benchmem |
			awk -v b="$b" -v r="$r" '/^Bench/ { print r, b, $3, $7 }'
	done
done | awk -v base="$base" '
function median(a, n) { asort(a); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
{ ns[$1 "," $2] = $3; allocs[$2] = $4; names[$2] = 1; rounds[$1] = 1 }
END {
	for (n in names) {
		if (n == base) continue
		k = 0
		for (r in rounds) { d[++k] = ns[r "," n] - ns[r "," base]; v[k] = ns[r "," n] }
		printf "%s: median %.0f ns/op, %s allocs/op (base %s); minus base: median %.0f ns, rounds %.0f to %.0f\n",
			n, median(v, k), allocs[n], allocs[base], median(d, k), d[1], d[k]
		delete d; delete v
	}
}'
