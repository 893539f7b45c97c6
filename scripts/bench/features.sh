#!/bin/bash
# features.sh PACKAGE BENCH ITERATIONS ROUNDS [FEATURE...]
#
# What each per-request feature of the middleware costs: builds PACKAGE's
# test binary with -tags idembench (see features_idembench.go) and runs the
# benchmark BENCH (a -test.bench pattern matching one benchmark) with every
# feature on ("none" off) and with each FEATURE off in turn (IDEM_BENCH_OFF),
# in interleaved rounds, ITERATIONS iterations each. Per variant it prints
# the medians over the rounds of ns/op, allocs/op and B/op, and of the cost
# measure below, and what turning the feature off saved: the median of the
# per-round differences from "none".
#
# The cost measure (MEASURE):
#   cpu           (default) user + system CPU time of the process per
#                 operation (GNU time), garbage collection on other threads
#                 included; less that of a 2-iteration run
#                 (a benchmark counting b.N runs its set-up twice; see
#                 instructions.sh), over ITERATIONS - 2.
#   instructions  instructions executed per operation, counted by valgrind's
#                 callgrind (all threads), less those of a 2-iteration run,
#                 with the garbage collector off (GOGC=off: whether a run
#                 holds one collection more or less would move the count by
#                 more than a feature costs; allocs/op and B/op show what
#                 the collector would have to do) and one processor
#                 (GOMAXPROCS=1: an idle processor's search for work would
#                 count too): deterministic to about 0.5 %, so it shows a
#                 feature's cost on a machine too loaded for timing. The binary is built without cgo and runs with
#                 GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off, which
#                 valgrind needs (it cannot decode RDTSCP, which Go
#                 1.26's runtime.cputicks executes); about 50
#                 times slower than a normal run.
#
# FEATURE defaults to: canonical heartbeat metrics logging recorder crypt
# deadlines bodytimeout. For example:
#
#   MEASURE=instructions scripts/bench/features.sh ./cmd/idem/internal/proxy '^BenchmarkProxy$/^new$' 1000 2
#   IDEM_TEST_REDIS_URL=... scripts/bench/features.sh ./idemredis '^BenchmarkMiddlewareRedisNewKey$' 20000 8
set -eu
pkg=$1 bench=$2 n=$3 rounds=$4
shift 4
[ "$n" -gt 2 ] || { echo "features.sh: ITERATIONS must exceed 2" >&2; exit 2; }
features=${*:-canonical heartbeat metrics logging recorder crypt deadlines bodytimeout}
MEASURE=${MEASURE:-cpu}
cd "$(dirname "$0")/../.."
bin=$(mktemp /tmp/features.XXXXXX.test)
trap 'rm -f "$bin" "$bin.out"' EXIT
case $MEASURE in
cpu) go test -c -tags idembench -o "$bin" "$pkg" ;;
instructions) CGO_ENABLED=0 go test -c -tags idembench -o "$bin" "$pkg" ;;
*) echo "features.sh: MEASURE must be cpu or instructions" >&2; exit 2 ;;
esac
dir=$(go list -f '{{.Dir}}' "$pkg")

# cost FEATURE ITERATIONS: runs the benchmark; prints "ns B allocs cost".
cost() {
	cd "$dir"
	case $MEASURE in
	cpu)
		IDEM_BENCH_OFF=$1 /usr/bin/time -f 'COST %U %S' -o "$bin.out" "$bin" -test.run '^$' -test.bench "$bench" \
			-test.benchtime "$2x" -test.benchmem >"$bin.out.bench"
		cat "$bin.out.bench" >>"$bin.out"
		rm -f "$bin.out.bench"
		;;
	instructions)
		IDEM_BENCH_OFF=$1 GOMAXPROCS=1 GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind --callgrind-out-file=/dev/null \
			"$bin" -test.run '^$' -test.bench "$bench" -test.benchtime "$2x" -test.benchmem >"$bin.out" 2>&1
		;;
	esac
	awk -v m="$MEASURE" '
		/^Bench/ { for (i = 3; i < NF; i++) { if ($(i + 1) == "ns/op") ns = $i; if ($(i + 1) == "B/op") b = $i; if ($(i + 1) == "allocs/op") a = $i } }
		$1 == "COST" { c = ($2 + $3) * 1e6 }
		/Collected :/ { c = $NF }
		END { printf "%.0f %.0f %.0f %.0f\n", ns, b, a, c }' "$bin.out"
}

unit="CPU µs/op"
[ "$MEASURE" = cpu ] || unit="instructions/op"
echo "features.sh: $pkg $bench, $n iterations, $rounds rounds, $MEASURE, commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty'), load average $(cut -d ' ' -f 1-3 /proc/loadavg) at the start"
for r in $(seq 1 "$rounds"); do
	for f in none $features; do
		one=$(cost "$f" 2)
		many=$(cost "$f" "$n")
		echo "$r $f $many ${one##* }"
	done
done | awk -v n="$n" -v features="none $features" -v unit="$unit" -v m="$MEASURE" '
function median(a, k,   i, j, t) {
	for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
}
{ ns[$1, $2] = $3; bytes[$1, $2] = $4; allocs[$1, $2] = $5; cost[$1, $2] = ($6 - $7) / (n - 2); if ($1 > rounds) rounds = $1 }
END {
	k = split(features, fs, " ")
	fmt = m == "cpu" ? "%.2f" : "%.0f"
	printf "| off | ns/op | %s | saved %s (rounds) | allocs/op | B/op |\n", unit, unit
	print "|---|---|---|---|---|---|"
	for (i = 1; i <= k; i++) {
		f = fs[i]; list = ""
		for (r = 1; r <= rounds; r++) { x[r] = ns[r, f]; c[r] = cost[r, f]; al[r] = allocs[r, f]; by[r] = bytes[r, f]
			d[r] = cost[r, "none"] - cost[r, f]; list = list sprintf("%s" fmt, r > 1 ? " " : "", d[r]) }
		if (f == "none")
			printf "| none (all on) | %.0f | " fmt " | | %g | %g |\n", median(x, rounds), median(c, rounds), median(al, rounds), median(by, rounds)
		else
			printf "| %s | %.0f | " fmt " | **%+" substr(fmt, 2) "** (%s) | %g | %g |\n", f, median(x, rounds), median(c, rounds), median(d, rounds), list, median(al, rounds), median(by, rounds)
	}
}'
