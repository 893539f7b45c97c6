#!/usr/bin/env bash
# soak.sh: a long run of `idem proxy` at a steady rate, with the maintainer
# (sweeper and reaper) running, to show that memory, latency and the store's
# size stay flat as the work goes on (run by hand, never in CI).
#
# Starts the trivial upstream and one `idem proxy --maintain --ttl TTL` per
# store of STORES (postgres, redis) in front of it, and drives each with wrk
# at a steady rate (CONNECTIONS connections, each waiting DELAY_MS between
# its requests), every request a new key, in runs of one minute, all stores
# at once. After each minute it appends one line per store to SERIES:
#
#   minute store req/s p50_us p99_us rss_kib records store_bytes errors non2xx
#
# rss_kib is the proxy's resident memory (VmRSS); records the store's
# records (PostgreSQL: rows of its idem_keys; Redis: keys under its prefix);
# store_bytes PostgreSQL's table with its indexes and TOAST
# (pg_total_relation_size), or for Redis the sum of MEMORY USAGE of a sample
# of 200 keys scaled to the count. With TTL shorter than the run, records
# expire and the reaper deletes them, so the store's size levels off.
# scripts/bench/soakchart.sh draws the series.
#
# Settings (environment): MINUTES=30 STORES="postgres redis" TTL=5m
# CONNECTIONS=4 DELAY_MS=8 PORT=18950 SERIES=soak.tsv, and
# IDEM_TEST_DATABASE_URL, IDEM_TEST_REDIS_URL as the tests (its own schema
# and key prefix, removed at the end).
#
#   MINUTES=30 SERIES=docs/soak.tsv scripts/bench/soak.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

MINUTES=${MINUTES:-30}
STORES=${STORES:-postgres redis}
TTL=${TTL:-5m}
CONNECTIONS=${CONNECTIONS:-4}
DELAY_MS=${DELAY_MS:-8}
PORT=${PORT:-18950}
SERIES=${SERIES:-soak.tsv}
PG_URL=${IDEM_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
REDIS_URL=${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}
TAG=idem_soak_$$

log() { echo "soak.sh: $*" >&2; }
command -v wrk >/dev/null || { log "needs wrk (apt-get install wrk)"; exit 1; }

work=$(mktemp -d /var/tmp/idem-soak.XXXXXX)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	psql -q "$PG_URL" -c "DROP SCHEMA IF EXISTS $TAG CASCADE" >/dev/null 2>&1 || true
	redis-cli -u "$REDIS_URL" --scan --pattern "$TAG:*" | xargs -r -n 500 redis-cli -u "$REDIS_URL" unlink >/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/idem" ./cmd/idem
go build -o "$work/upstream" ./cmd/idem/internal/loadgen/upstream

with_param() { if [[ $1 == *\?* ]]; then echo "$1&$2"; else echo "$1?$2"; fi; }
declare -A pid_of port_of
start() {
	local name=$1 port=$2
	shift 2
	"$@" >"$work/$name.log" 2>&1 &
	pids+=("$!")
	pid_of[$name]=$!
	for _ in $(seq 1 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	log "$name did not listen on $port"
	cat "$work/$name.log" >&2
	exit 1
}

start upstream "$PORT" "$work/upstream" --listen "127.0.0.1:$PORT"
n=1
for store in $STORES; do
	case $store in
	postgres) url=$(with_param "$PG_URL" "schema=$TAG") ;;
	redis) url=$(with_param "$REDIS_URL" "prefix=$TAG:") ;;
	*) log "unknown store $store (want postgres, redis)"; exit 2 ;;
	esac
	port_of[$store]=$((PORT + n))
	start "$store" "$((PORT + n))" "$work/idem" proxy --listen "127.0.0.1:$((PORT + n))" \
		--upstream "http://127.0.0.1:$PORT" --store "$url" --ttl "$TTL" --maintain
	n=$((n + 1))
done

cat >"$work/soak.lua" <<EOF
local threads = 0
function setup(thread)
	threads = threads + 1
	thread:set("tid", threads)
end
local prefix, n = "k", 0
wrk.method = "POST"
wrk.body = '{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}'
wrk.headers["Content-Type"] = "application/json"
function init(args) prefix = args[1] end
function delay() return $DELAY_MS end
function request()
	n = n + 1
	wrk.headers["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. n
	return wrk.format()
end
function done(summary, latency)
	local e = summary.errors
	io.write(string.format("RESULT %d %d %d %d %d %d\n", summary.requests, summary.duration,
		latency:percentile(50), latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
EOF

# size STORE: "records bytes" of the store.
size() {
	case $1 in
	postgres)
		psql -At -F ' ' "$PG_URL" -c "SELECT count(*), pg_total_relation_size('$TAG.idem_keys') FROM $TAG.idem_keys" ;;
	redis)
		redis-cli -u "$REDIS_URL" --scan --pattern "$TAG:*" >"$work/keys"
		local count sample
		count=$(wc -l <"$work/keys")
		sample=$(shuf -n 200 "$work/keys" | while read -r k; do redis-cli -u "$REDIS_URL" memory usage "$k"; done |
			awk '{ s += $1; n++ } END { print n ? s / n : 0 }')
		awk -v c="$count" -v s="$sample" 'BEGIN { printf "%d %.0f\n", c, c * s }' ;;
	esac
}

echo "# soak.sh: commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty'), $(date -u +%Y-%m-%dT%H:%MZ), $MINUTES min, ttl $TTL, wrk -t 1 -c $CONNECTIONS with ${DELAY_MS} ms between requests per connection" >"$SERIES"
echo "# minute store req/s p50_us p99_us rss_kib records store_bytes errors non2xx load1" >>"$SERIES"
log "$MINUTES minutes; series in $SERIES"
for minute in $(seq 1 "$MINUTES"); do
	runs=()
	for store in $STORES; do
		wrk -t 1 -c "$CONNECTIONS" -d 60s -s "$work/soak.lua" "http://127.0.0.1:${port_of[$store]}/v1/payments" \
			-- "$TAG-$minute-$store" >"$work/$store.wrk" 2>&1 &
		runs+=("$!")
	done
	wait "${runs[@]}" || true
	for store in $STORES; do
		rss=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/${pid_of[$store]}/status")
		awk -v m="$minute" -v s="$store" -v rss="$rss" -v sz="$(size "$store")" -v la="$(cut -d " " -f 1 /proc/loadavg)" '
			$1 == "RESULT" { printf "%d %s %.0f %d %d %d %s %d %d %s\n", m, s, $2 / ($3 / 1e6), $4, $5, rss, sz, $6, $7, la }' \
			"$work/$store.wrk" | tee -a "$SERIES" >&2
	done
done
