#!/bin/bash
# redisinstructions.sh TESTBIN ITERATIONS BENCH...
#
# Prints the instructions a private redis-server executes per operation of
# each benchmark BENCH (a -test.bench pattern matching one benchmark) of
# TESTBIN, a test binary of a package whose benchmarks use the Redis at
# IDEM_TEST_REDIS_URL (idemredis, idemcache), and the commands it ran per
# operation (INFO commandstats: the scripts' commands are counted too). The
# server runs under valgrind's callgrind on PORT (default 16390, --save ''
# --appendonly no) and serves the benchmark alone; its counters are zeroed
# before a run and read after it (callgrind_control), and the figure is
# those of an ITERATIONS-iteration run less those of a 2-iteration run (the
# benchmark's set-up, which a benchmark counting b.N runs twice: see
# instructions.sh), divided by ITERATIONS - 2, after one run that is not
# counted (it loads the scripts). The figure includes the benchmark's
# removal of its keys at the end of a run (SCAN, UNLINK), a few thousand
# instructions per new key. As with instructions.sh, the count is
# load-independent to about 1 %, and it is not time: the kernel's work for
# the socket reads and writes (a good part of the server's CPU time per
# round trip) is not in it. The server's work does not depend on the
# client's GOMAXPROCS, but a benchmark with parallel callers may batch
# calls into pipelines (idemredis.Config.MaxBatches), which saves the
# server some work per call; GOMAXPROCS=1 (the default here, see GOMAXPROCS)
# sends them one at a time.
#
#   go test -c -o /tmp/idemredis.test ./idemredis
#   cd idemredis && ../scripts/bench/redisinstructions.sh /tmp/idemredis.test 2000 \
#       '^BenchmarkMiddlewareRedisNewKey$' '^BenchmarkMiddlewareRedisReplay$'
set -eu
bin=$1 n=$2
shift 2
[ "$n" -gt 2 ] || { echo "redisinstructions.sh: ITERATIONS must exceed 2" >&2; exit 2; }
port=${PORT:-16390}
work=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
	redis-server --port "$port" --save '' --appendonly no >"$work/valgrind.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
	redis-cli -p "$port" ping >/dev/null 2>&1 && break
	sleep 0.2
done
run() {
	IDEM_TEST_REDIS_URL=redis://127.0.0.1:$port/0 GOMAXPROCS=${GOMAXPROCS:-1} \
		"$bin" -test.run '^$' -test.bench "$1" -test.benchtime "$2x" >"$work/out" 2>&1 ||
		{ cat "$work/out" >&2; exit 1; }
}
# count BENCH ITERATIONS: prints the server's instructions over the run, then
# the commands it ran as NAME=CALLS.
count() {
	redis-cli -p "$port" config resetstat >/dev/null
	callgrind_control -z "$pid" >/dev/null 2>&1
	run "$1" "$2"
	callgrind_control -d "$pid" >/dev/null 2>&1
	local f
	f=$(ls -t "$work"/cg."$pid".* | head -1)
	awk '/^(summary|totals):/ { print $2; exit }' "$f"
	rm -f "$f"
	redis-cli -p "$port" info commandstats | tr -d '\r' |
		awk -F'[:=,]' '/^cmdstat_/ && $1 !~ /config|hello|ping|client/ { sub("cmdstat_", "", $1); print $1 "=" $3 }'
}
for b in "$@"; do
	run "$b" 1
	count "$b" 2 >"$work/two"
	count "$b" "$n" >"$work/many"
	awk -v b="$b" -v n="$n" '
		FNR == 1 { if (NR == 1) two = $1; else total = $1; next }
		{ split($0, kv, "=") }
		NR == FNR { base[kv[1]] = kv[2]; next }
		{ calls = calls sprintf(" %s=%.2f", kv[1], (kv[2] - base[kv[1]]) / (n - 2)) }
		END { printf "%s: %.0f server instructions/op, commands/op:%s\n", b, (total - two) / (n - 2), calls }' "$work/two" "$work/many"
done
