#!/bin/bash
# features.sh PACKAGE BENCH ITERATIONS ROUNDS [FEATURE...]
#
# What each per-request feature of the middleware costs: builds PACKAGE's
# test binary with -tags idembench (see features_idembench.go) and runs the
# benchmark BENCH (a -test.bench pattern matching one benchmark) with every
# feature on ("none" off) and with each FEATURE off in turn (IDEM_BENCH_OFF),
# in interleaved rounds, ITERATIONS iterations each. Per variant it prints
# the median ns/op, CPU time per operation (user + system of the whole
# process over ITERATIONS, garbage collection included, from GNU time),
# allocs/op and B/op, and what turning the feature off saved: the median over
# the rounds of the per-round difference from "none".
#
# FEATURE defaults to: canonical heartbeat metrics logging recorder crypt
# deadlines. For example:
#
#   scripts/bench/features.sh ./cmd/idem/internal/proxy '^BenchmarkProxy$/^new$' 20000 8
#   IDEM_TEST_REDIS_URL=... scripts/bench/features.sh ./idemredis '^BenchmarkMiddlewareRedisNewKey$' 20000 8
set -eu
pkg=$1 bench=$2 n=$3 rounds=$4
shift 4
features=${*:-canonical heartbeat metrics logging recorder crypt deadlines}
cd "$(dirname "$0")/../.."
bin=$(mktemp /tmp/features.XXXXXX.test)
trap 'rm -f "$bin" "$bin.time"' EXIT
go test -c -tags idembench -o "$bin" "$pkg"
dir=$(go list -f '{{.Dir}}' "$pkg")
echo "features.sh: $pkg $bench, $n iterations, $rounds rounds, commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty'), load average $(cut -d ' ' -f 1-3 /proc/loadavg) at the start"
for r in $(seq 1 "$rounds"); do
	for f in none $features; do
		(cd "$dir" && IDEM_BENCH_OFF=$f /usr/bin/time -f '%U %S' -o "$bin.time" "$bin" -test.run '^$' -test.bench "$bench" \
			-test.benchtime "${n}x" -test.benchmem) | awk -v f="$f" -v r="$r" -v n="$n" \
			'/^Bench/ { for (i = 3; i < NF; i++) { if ($(i + 1) == "ns/op") ns = $i; if ($(i + 1) == "B/op") b = $i; if ($(i + 1) == "allocs/op") a = $i }
				print r, f, ns, b, a }'
		echo "cpu $r $f $(awk '{ print $1 + $2 }' "$bin.time")"
	done
done | awk -v n="$n" -v features="none $features" '
function median(a, k,   i, j, t) {
	for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
}
$1 == "cpu" { cpu[$2, $3] = $4 * 1e6 / n; next }
{ ns[$1, $2] = $3; bytes[$1, $2] = $4; allocs[$1, $2] = $5; if ($1 > rounds) rounds = $1 }
END {
	k = split(features, fs, " ")
	print "| off | ns/op | saved ns/op (rounds) | CPU µs/op | saved CPU µs/op | allocs/op | B/op |"
	print "|---|---|---|---|---|---|---|"
	for (i = 1; i <= k; i++) {
		f = fs[i]; list = ""
		for (r = 1; r <= rounds; r++) { x[r] = ns[r, f]; c[r] = cpu[r, f]; al[r] = allocs[r, f]; by[r] = bytes[r, f]
			d[r] = ns[r, "none"] - ns[r, f]; dc[r] = cpu[r, "none"] - cpu[r, f]; list = list sprintf("%s%d", r > 1 ? " " : "", d[r]) }
		if (f == "none")
			printf "| none (all on) | %.0f | | %.2f | | %g | %g |\n", median(x, rounds), median(c, rounds), median(al, rounds), median(by, rounds)
		else
			printf "| %s | %.0f | **%+.0f** (%s) | %.2f | %+.2f | %g | %g |\n", f, median(x, rounds), median(d, rounds), list, median(c, rounds), median(dc, rounds), median(al, rounds), median(by, rounds)
	}
}'
