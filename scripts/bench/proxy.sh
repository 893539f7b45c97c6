#!/usr/bin/env bash
# proxy.sh: the end-to-end benchmark of `idem proxy` (run by hand, never in CI).
#
# Builds idem, the trivial upstream (cmd/idem/internal/loadgen/upstream) and a
# bare httputil.ReverseProxy (cmd/idem/internal/loadgen/bareproxy), starts the
# bare proxy and one `idem proxy` per store in front of the upstream, and
# drives each with wrk (THREADS threads, CONNECTIONS connections) in
# interleaved rounds: in every round, for each shape, every target runs once,
# one after the other, so that all of them see the same load. Shapes:
#
#   new     every request a fresh Idempotency-Key (the proxy reserves,
#           forwards and completes)
#   replay  one key, sent first once to complete it, then repeated (the
#           proxy answers from the store; the bare proxy forwards)
#
# Two baselines run in every round: "bare", the bare proxy with idem proxy's
# own transport settings (256 idle connections per host), which the ratios
# are taken against; and "bare-default", the same proxy on
# http.DefaultTransport (2 idle connections per host: under 16 connections
# it opens a new upstream connection for most requests), the untuned reverse
# proxy issue 16's first figures were measured against; the "vs default
# bare" column is the throughput relative to it (BASELINES="bare" drops it).
# BASELINES may also name "static": cmd/idem/internal/loadgen/static, a
# net/http server that drains the request and answers with the constant
# bytes of a replay (no proxy, no store, no upstream): the ceiling of any
# answer a Go proxy gives without forwarding, a replay's. And BASELINES may
# name "minimal": cmd/idem/internal/loadgen/minproxy, the bare proxy plus the
# least a durable idempotency layer does with the same store clients (a new
# key: insert the key, forward, store the answer, two writes in sequence,
# each durable before it goes on; a replay: the stored answer), on each
# store of STORES among redis, postgres and sqlite, as the target
# "minimal-STORE" (Redis prefix TAG-min:, PostgreSQL table TAG_min.keys with
# application_name TAG_min, SQLite the file minimal.db beside idem's, at the
# same SQLITE_SYNC). Redis and PostgreSQL writes go one by one; SQLite's
# share commits (one writer takes every write queued when it begins a
# transaction). It is the floor of a new key for any layer with the same
# store: a layer ahead of the peer by more than the peer is behind it must
# beat that floor.
#
# Every run also takes the client's CPU per request (wrk's user + system
# time, from bash's time): on this machine wrk shares the cores with the
# proxy, so a throughput ratio between two proxies is the ratio of
# client + proxy (+ store) CPU, not of the proxies' alone.
#
# Per shape and target it prints the throughput relative to the bare proxy
# (the median of the rounds' ratios, and every round's), the median p50 and
# p99 latency, and the CPU time per request (user + system, from
# /proc/PID/stat) of the proxy process and of the store's server: the Redis
# server, or the PostgreSQL backends of the proxy's connections (found by
# application_name). SQLite runs in the proxy's process. STORES may also
# name memory: the proxy without a store's cost, for reference; and
# postgres-async: PostgreSQL with synchronous_commit=off, the option that
# trades durability (a PostgreSQL crash loses the last commits) for speed.
#
# PEER_CMD names an external command to measure beside idem proxy on the
# same upstream, for a side-by-side run with another library (built outside
# this repository, never committed): for each store of PEER_STORES (default:
# those of STORES among memory, redis, postgres) the script runs
#   $PEER_CMD --listen ADDR --upstream URL --store STORE_URL
# as the target "peer-STORE", where STORE_URL is memory:, the Redis URL with
# ?prefix=TAG-peer: or the PostgreSQL URL with ?table=TAG_peer.keys (a schema
# the script creates and drops) and application_name=TAG_peer, by which the
# store's CPU is found as for idem.
#
# PG_FLOOR=1 (with postgres in STORES) also measures, in every round after
# the new-key runs, the floor under a PostgreSQL new key: pgbench (prepared
# statements, CONNECTIONS clients, DURATION) sending the two single-row
# statements a new key needs, an INSERT of a record and an UPDATE of it by
# its primary key, each its own commit, on a table of idem's columns with
# only the primary key; the PostgreSQL backends' CPU per pair, found by
# application_name as for the proxies, is compared with idem's per new key.
# In the same rounds it runs the same two statements on idem's own table
# (a schema migrated by `idem migrate up`: its indexes for the sweeper,
# reaper and reconciler, and its checks), "the floor on idem's table".
#
# PROFILE=DIR: after the rounds, one more run per shape and idem target,
# not counted, during which a CPU profile of the proxy (DURATION less two
# seconds, from the second second) is written to DIR/SHAPE-STORE.pprof;
# idem is then built with -tags pprof (cmd/idem/pprof.go), each target
# serving pprof on its port + 1000. Read them with `go tool pprof -top`.
#
# Settings (environment):
#   ROUNDS=3  DURATION=6s  STORES="sqlite postgres redis"  SHAPES="new replay"
#   PEER_CMD  PEER_STORES  PG_FLOOR  PROFILE
#   BASELINES="bare bare-default"
#   THREADS=2  CONNECTIONS=16  PORT=18900 (PORT and the ports after it, one per target)
#   SQLITE_SYNC=FULL (or NORMAL)  WORKDIR (default: a new directory under
#   /var/tmp; the SQLite file lives there, so it must not be tmpfs)
#   IDEM_TEST_DATABASE_URL, IDEM_TEST_REDIS_URL (as the tests; the run uses
#   its own schema and key prefix and removes them at the end)
#
#   scripts/bench/proxy.sh
#   ROUNDS=5 DURATION=10s STORES=sqlite scripts/bench/proxy.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-6s}
STORES=${STORES:-sqlite postgres redis}
SHAPES=${SHAPES:-new replay}
BASELINES=${BASELINES:-bare bare-default}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-16}
PORT=${PORT:-18900}
SQLITE_SYNC=${SQLITE_SYNC:-FULL}
PEER_CMD=${PEER_CMD:-}
PG_FLOOR=${PG_FLOOR:-}
if [ -z "${PEER_STORES+set}" ]; then
	PEER_STORES=
	for s in $STORES; do case $s in memory | redis | postgres) PEER_STORES="$PEER_STORES $s" ;; esac; done
fi
[ -n "$PEER_CMD" ] || PEER_STORES=
PG_URL=${IDEM_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
REDIS_URL=${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}
TAG=idem_e2e_$$ # schema, application_name and Redis key prefix of this run

log() { echo "proxy.sh: $*" >&2; }

# wrk, installed as .ci/run installs its tools.
if ! command -v wrk >/dev/null 2>&1; then
	log "installing wrk"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi

work=${WORKDIR:-$(mktemp -d /var/tmp/idem-e2e.XXXXXX)}
mkdir -p "$work"
if [ "$(df --output=fstype "$work" | tail -n 1)" = tmpfs ]; then
	log "warning: $work is tmpfs: fsync is free there, SQLite's figures mean nothing"
fi

pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [[ " $STORES $PEER_STORES " == *" postgres"* ]]; then
		psql -q "$PG_URL" -c "DROP SCHEMA IF EXISTS $TAG CASCADE" -c "DROP SCHEMA IF EXISTS ${TAG}_peer CASCADE" \
			-c "DROP SCHEMA IF EXISTS ${TAG}_floor CASCADE" -c "DROP SCHEMA IF EXISTS ${TAG}_table CASCADE" \
		-c "DROP SCHEMA IF EXISTS ${TAG}_min CASCADE" >/dev/null 2>&1 || true
	fi
	if [[ " $STORES $PEER_STORES " == *" redis "* ]]; then
		redis-cli -u "$REDIS_URL" --scan --pattern "$TAG*" | xargs -r -n 500 redis-cli -u "$REDIS_URL" unlink >/dev/null || true
	fi
	[ -n "${WORKDIR:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

log "building into $work"
PROFILE=${PROFILE:-}
if [ -n "$PROFILE" ]; then
	mkdir -p "$PROFILE"
	go build -tags pprof -o "$work/idem" ./cmd/idem
else
	go build -o "$work/idem" ./cmd/idem
fi
go build -o "$work/upstream" ./cmd/idem/internal/loadgen/upstream
go build -o "$work/bareproxy" ./cmd/idem/internal/loadgen/bareproxy
go build -o "$work/static" ./cmd/idem/internal/loadgen/static
go build -o "$work/minproxy" ./cmd/idem/internal/loadgen/minproxy

# with_param URL NAME=VALUE appends a query parameter.
with_param() { if [[ $1 == *\?* ]]; then echo "$1&$2"; else echo "$1?$2"; fi; }

# start NAME PORT COMMAND...: runs COMMAND in the background, logging to
# $work/NAME.log, and waits until PORT accepts connections. A port already
# taken (another run of this script) stops the run instead of measuring
# someone else's process.
declare -A pid_of
start() {
	local name=$1 port=$2
	shift 2
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		log "port $port is already in use; set PORT to another base"
		exit 1
	fi
	"$@" >"$work/$name.log" 2>&1 &
	pids+=("$!")
	pid_of[$name]=$!
	for _ in $(seq 1 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	log "$name did not listen on $port; its log:"
	cat "$work/$name.log" >&2
	exit 1
}

upstream=http://127.0.0.1:$PORT
start upstream "$PORT" "$work/upstream" --listen "127.0.0.1:$PORT"
targets=(bare)
declare -A port_of=([bare]=$((PORT + 1)))
start bare "$((PORT + 1))" "$work/bareproxy" --listen "127.0.0.1:$((PORT + 1))" --upstream "$upstream"
n=2
if [[ " $BASELINES " == *" bare-default "* ]]; then
	port_of[bare-default]=$((PORT + n))
	start bare-default "$((PORT + n))" "$work/bareproxy" --listen "127.0.0.1:$((PORT + n))" \
		--upstream "$upstream" --transport default
	targets+=(bare-default)
	n=$((n + 1))
fi
if [[ " $BASELINES " == *" static "* ]]; then
	port_of[static]=$((PORT + n))
	start static "$((PORT + n))" "$work/static" --listen "127.0.0.1:$((PORT + n))"
	targets+=(static)
	n=$((n + 1))
fi
for store in $STORES; do
	case $store in
	sqlite) url="sqlite:$work/proxy.db?synchronous=$SQLITE_SYNC" ;;
	postgres) url=$(with_param "$(with_param "$PG_URL" "schema=$TAG")" "application_name=$TAG") ;;
	postgres-async)
		url=$(with_param "$(with_param "$(with_param "$PG_URL" "schema=$TAG")" "application_name=${TAG}_async")" \
			synchronous_commit=off) ;;
	redis) url=$(with_param "$REDIS_URL" "prefix=$TAG:") ;;
	memory) url=memory: ;;
	*) log "unknown store $store (want sqlite, postgres, postgres-async, redis, memory)"; exit 2 ;;
	esac
	port_of[$store]=$((PORT + n))
	IDEM_PPROF_ADDR=127.0.0.1:$((PORT + n + 1000)) \
		start "$store" "$((PORT + n))" "$work/idem" proxy --listen "127.0.0.1:$((PORT + n))" --upstream "$upstream" --store "$url"
	targets+=("$store")
	n=$((n + 1))
done
if [[ " $BASELINES " == *" minimal "* ]]; then
	for store in $STORES; do
		case $store in
		redis) url=$(with_param "$REDIS_URL" "prefix=$TAG-min:") ;;
		postgres)
			psql -q "$PG_URL" -c "CREATE SCHEMA ${TAG}_min" >/dev/null
			url=$(with_param "$(with_param "$PG_URL" "table=${TAG}_min.keys")" "application_name=${TAG}_min") ;;
		sqlite) url="sqlite:$work/minimal.db?synchronous=$SQLITE_SYNC" ;;
		*) continue ;;
		esac
		port_of[minimal-$store]=$((PORT + n))
		start "minimal-$store" "$((PORT + n))" "$work/minproxy" --listen "127.0.0.1:$((PORT + n))" --upstream "$upstream" --store "$url"
		targets+=("minimal-$store")
		n=$((n + 1))
	done
fi
for store in $PEER_STORES; do
	case $store in
	memory) url=memory: ;;
	redis) url=$(with_param "$REDIS_URL" "prefix=$TAG-peer:") ;;
	postgres)
		psql -q "$PG_URL" -c "CREATE SCHEMA ${TAG}_peer" >/dev/null
		url=$(with_param "$(with_param "$PG_URL" "table=${TAG}_peer.keys")" "application_name=${TAG}_peer") ;;
	*) log "PEER_STORES: unknown store $store (want memory, redis, postgres)"; exit 2 ;;
	esac
	port_of[peer-$store]=$((PORT + n))
	# shellcheck disable=SC2086 # PEER_CMD may carry arguments
	start "peer-$store" "$((PORT + n))" $PEER_CMD --listen "127.0.0.1:$((PORT + n))" --upstream "$upstream" --store "$url"
	targets+=("peer-$store")
	n=$((n + 1))
done

# The wrk script: POSTs a JSON body with an Idempotency-Key; args[1] is the
# key prefix, args[2] the shape. It prints one RESULT line: requests,
# duration (µs), p50 and p99 latency (µs), socket errors, non-2xx answers.
cat >"$work/idem.lua" <<'EOF'
local threads = 0
function setup(thread)
	threads = threads + 1
	thread:set("tid", threads)
end

local prefix, shape, n = "k", "new", 0
wrk.method = "POST"
wrk.body = '{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}'
wrk.headers["Content-Type"] = "application/json"

function init(args)
	prefix, shape = args[1], args[2]
	wrk.headers["Idempotency-Key"] = prefix
end

function request()
	if shape == "new" then
		n = n + 1
		wrk.headers["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. n
	end
	return wrk.format()
end

function done(summary, latency)
	local e = summary.errors
	io.write(string.format("RESULT %d %d %d %d %d %d\n", summary.requests, summary.duration,
		latency:percentile(50), latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
EOF

# ticks PID...: prints "PID utime+stime" (clock ticks) of each live PID.
ticks() {
	local pid
	for pid in "$@"; do
		[ -r "/proc/$pid/stat" ] || continue
		# Fields after "PID (comm) ": utime and stime are the 12th and 13th.
		# (a process may end between the test and the read)
		{ sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null || true; } | awk -v pid="$pid" 'NF { print pid, $12 + $13 }'
	done
}

# store_pids TARGET: the processes of TARGET's store server.
redis_pid=
if [[ " $STORES $PEER_STORES " == *" redis "* ]]; then
	redis_pid=$(redis-cli -u "$REDIS_URL" info server | tr -d '\r' | awk -F: '$1 == "process_id" { print $2 }')
fi
store_pids() {
	case $1 in
	postgres) psql -At "$PG_URL" -c "SELECT pid FROM pg_stat_activity WHERE application_name = '$TAG'" ;;
	postgres-async) psql -At "$PG_URL" -c "SELECT pid FROM pg_stat_activity WHERE application_name = '${TAG}_async'" ;;
	redis | peer-redis | minimal-redis) echo "$redis_pid" ;;
	minimal-postgres) psql -At "$PG_URL" -c "SELECT pid FROM pg_stat_activity WHERE application_name = '${TAG}_min'" ;;
	floor | table) psql -At "$PG_URL" -c "SELECT pid FROM pg_stat_activity WHERE application_name = '${TAG}_$1'" ;;
	peer-postgres) psql -At "$PG_URL" -c "SELECT pid FROM pg_stat_activity WHERE application_name = '${TAG}_peer'" ;;
	esac
}

# cpu_delta BEFORE AFTER: total ticks gained by the processes of AFTER
# (a process missing from BEFORE started during the run: all its ticks).
# AFTER may list a PID several times (samples taken during the run): its
# largest count counts, so a process that ended during the run (a pool
# that closes and opens connections) keeps the ticks it was last seen with.
cpu_delta() {
	awk 'NR == FNR { before[$1] = $2; next } { if (!($1 in last) || $2 > last[$1]) last[$1] = $2 }
		END { for (p in last) sum += last[p] - before[p]; print sum + 0 }' \
		<(echo "$1") <(echo "$2")
}

# sample_store TARGET FILE: appends the ticks of TARGET's store processes
# to FILE every half second until killed.
sample_store() {
	while :; do
		# shellcheck disable=SC2046
		ticks $(store_pids "$1") >>"$2"
		sleep 0.5
	done
}

hz=$(getconf CLK_TCK)
results=$work/results

# complete_once URL KEY: sends the benchmark's request once with KEY, so
# that the runs of the replay shape replay it.
complete_once() {
	curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' -H "Idempotency-Key: $2" \
		--data '{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}' "$1"
}

# measure SHAPE TARGET ROUND: one wrk run; appends "shape target round rps
# p50 p99 proxy_us store_us errors non2xx client_us" to $results.
measure() {
	local shape=$1 target=$2 round=$3
	local url="http://127.0.0.1:${port_of[$target]}/v1/payments"
	local prefix="$TAG-$round-$target-$shape"
	[ "$shape" != replay ] || complete_once "$url" "$prefix"
	local pp=${pid_of[$target]} sp p0 s0 p1 s1 out
	sp=$(store_pids "$target")
	# shellcheck disable=SC2086 # sp is a list of PIDs
	p0=$(ticks "$pp") s0=$(ticks $sp)
	local sampler= samples=$work/samples
	: >"$samples"
	if [ -n "$sp" ]; then
		sample_store "$target" "$samples" &
		sampler=$!
	fi
	local TIMEFORMAT='%U %S' client
	# wrk's user and system seconds go to $work/client (bash's time).
	{ time wrk -t "$THREADS" -c "$CONNECTIONS" -d "$DURATION" -s "$work/idem.lua" "$url" -- "$prefix" "$shape" \
		>"$work/wrk.out"; } 2>"$work/client"
	out=$(cat "$work/wrk.out")
	client=$(awk '{ print $1 + $2 }' "$work/client")
	[ -z "$sampler" ] || { kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true; }
	sp=$(store_pids "$target")
	# shellcheck disable=SC2086
	p1=$(ticks "$pp") s1=$(cat "$samples"; ticks $sp)
	echo "$out" | awk -v shape="$shape" -v target="$target" -v round="$round" -v hz="$hz" \
		-v pt="$(cpu_delta "$p0" "$p1")" -v st="$(cpu_delta "$s0" "$s1")" -v store="$sp" -v client="$client" '
		$1 == "RESULT" {
			us = 1e6 / hz / $2
			printf "%s %s %s %.0f %d %d %.1f %s %d %d %.1f\n", shape, target, round, $2 / ($3 / 1e6), $4, $5,
				pt * us, store == "" ? "-" : sprintf("%.1f", st * us), $6, $7, client * 1e6 / $2
		}' | tee -a "$results" >&2
}

log "warming up"
for target in "${targets[@]}"; do
	wrk -t "$THREADS" -c "$CONNECTIONS" -d 1s -s "$work/idem.lua" \
		"http://127.0.0.1:${port_of[$target]}/v1/payments" -- "$TAG-warm-$target" new >/dev/null
done

log "$ROUNDS rounds of $DURATION per target and shape; per run: shape target round req/s p50_us p99_us proxy_cpu_us store_cpu_us errors non2xx client_cpu_us"
# The floor's table and pgbench script (PG_FLOOR).
floors=$work/floors
if [ -n "$PG_FLOOR" ] && [[ " $STORES " == *" postgres "* ]]; then
	psql -q "$PG_URL" -c "CREATE SCHEMA ${TAG}_floor" -c "CREATE TABLE ${TAG}_floor.keys (
		scope text COLLATE \"C\" NOT NULL, endpoint text COLLATE \"C\" NOT NULL, key text COLLATE \"C\" NOT NULL,
		fingerprint text NOT NULL, state text NOT NULL, token text NOT NULL, locked_until timestamptz NOT NULL,
		started_at timestamptz NOT NULL, lease_expired_state text NOT NULL, response_status integer,
		response_header jsonb, response_body bytea, not_replayable boolean NOT NULL DEFAULT false,
		recovery_point text NOT NULL DEFAULT '', attempts integer NOT NULL DEFAULT 1,
		created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
		waiters boolean NOT NULL DEFAULT false, ttl interval, reconcile_after timestamptz,
		reconcile_attempts integer NOT NULL DEFAULT 0, reconcile_error text NOT NULL DEFAULT '',
		PRIMARY KEY (scope, endpoint, key))" >/dev/null
	# plain TABLE: the floor's two statements on TABLE.
	plain() {
		cat <<SQL
\\set k random(1, 9000000000000000)
INSERT INTO $1 (scope, endpoint, key, fingerprint, state, token, locked_until, started_at,
	lease_expired_state, attempts, created_at, updated_at, expires_at, ttl)
	VALUES ('', 'POST /v1/payments', 'k-' || :k, '9f2c4e7b1a3d5f6e8c0b2a4d6f8e1c3b5a7d9f0e2c4b6a8d1f3e5c7b9a0d2f4e', 'in_progress',
	'5f0c2a7e9b1d3f6a8c4e0b2d7f9a1c3e', now() + interval '30 seconds', now(), 'unknown', 1, now(), now(),
	now() + interval '24 hours', interval '24 hours');
UPDATE $1 SET state = 'completed', response_status = 201,
	response_header = '{"Content-Type": ["application/json"]}',
	response_body = '{"method":"POST","path":"/v1/payments","body":{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}}'::bytea,
	updated_at = now()
	WHERE scope = '' AND endpoint = 'POST /v1/payments' AND key = 'k-' || :k;
SQL
	}
	plain "${TAG}_floor.keys" >"$work/floor.sql"
	# The same statements on idem's own table, migrated as idem migrates it.
	"$work/idem" migrate up --store "$(with_param "$PG_URL" "schema=${TAG}_table")" >/dev/null
	plain "${TAG}_table.idem_keys" >"$work/table.sql"
fi

# floor ROUND VARIANT: one pgbench run of $work/VARIANT.sql (floor: the
# table with only a primary key; table: idem's table); appends "round
# pairs/s cpu_us_per_pair variant" to $floors.
floor() {
	local s0 s1 out pairs v=$2
	# shellcheck disable=SC2046
	s0=$(ticks $(store_pids "$v"))
	PGAPPNAME=${TAG}_$v pgbench -n -M prepared -c "$CONNECTIONS" -j "$THREADS" -T "${DURATION%s}" \
		-f "$work/$v.sql" "$PG_URL" >"$work/floor.out" 2>&1 &
	local bench=$! samples=$work/samples
	: >"$samples"
	sample_store "$v" "$samples" &
	local sampler=$!
	wait "$bench" || true
	kill "$sampler" 2>/dev/null || true
	wait "$sampler" 2>/dev/null || true
	s1=$(cat "$samples")
	pairs=$(awk -F': ' '/^number of transactions actually processed/ { split($2, a, "/"); print a[1] }' "$work/floor.out")
	awk -v r="$1" -v v="$v" -v pairs="$pairs" -v st="$(cpu_delta "$s0" "$s1")" -v hz="$hz" \
		'/^tps = / { printf "%s %.0f %.1f %s\n", r, $3, st * 1e6 / hz / pairs, v }' "$work/floor.out" | tee -a "$floors" >&2
}

for round in $(seq 1 "$ROUNDS"); do
	for shape in $SHAPES; do
		for target in "${targets[@]}"; do
			measure "$shape" "$target" "$round"
		done
		if [ "$shape" = new ] && [ -s "$work/floor.sql" ]; then
			floor "$round" floor
			floor "$round" table
		fi
	done
done

if [ -n "$PROFILE" ]; then
	for shape in $SHAPES; do
		for store in $STORES; do
			url="http://127.0.0.1:${port_of[$store]}/v1/payments" prefix="$TAG-profile-$store-$shape"
			[ "$shape" != replay ] || complete_once "$url" "$prefix"
			wrk -t "$THREADS" -c "$CONNECTIONS" -d "$DURATION" -s "$work/idem.lua" "$url" -- "$prefix" "$shape" >/dev/null &
			sleep 1
			curl -sf -o "$PROFILE/$shape-$store.pprof" \
				"http://127.0.0.1:$((${port_of[$store]} + 1000))/debug/pprof/profile?seconds=$(( ${DURATION%s} > 3 ? ${DURATION%s} - 2 : 1 ))"
			wait $!
			log "profile: $PROFILE/$shape-$store.pprof"
		done
	done
fi

echo "idem proxy against a bare reverse proxy: commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty'), $(date -u +%Y-%m-%d)"
echo "wrk -t $THREADS -c $CONNECTIONS, $ROUNDS rounds of $DURATION, SQLite synchronous=$SQLITE_SYNC, load average $(cut -d ' ' -f 1-3 /proc/loadavg) at the end"
echo
echo "| shape | target | vs bare (median) | rounds | req/s | p50 | p99 | proxy CPU/req | vs bare's | store CPU/req (vs bare proxy's) | client CPU/req | errors, non-2xx |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
awk '
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function ms(us) { return sprintf("%.2f ms", us / 1000) }
# compare(A, B, TITLE): the targets A-STORE (idem: A empty) against B-STORE,
# round by round, where both ran.
function compare(a, b, title,   i, k, f, shape, store, own, rounds, prounds, c, r, r2, q, pq, sc, done) {
	for (i = 1; i <= n; i++) {
		k = order[i]; split(k, f, SUBSEP); shape = f[1]
		if (index(f[2], b) != 1) continue
		store = substr(f[2], length(b) + 1)
		own = shape SUBSEP a store
		if (!(own in count)) continue
		if (!done++) {
			printf "\n%s; medians of the per-round ratios; CPU from the medians, and paired round by round):\n\n", title
			print "| shape | store | throughput | rounds | proxy CPU/req | proxy CPU/req paired: median (rounds) | store CPU/req | client + proxy + store CPU/req |"
			print "|---|---|---|---|---|---|---|---|"
		}
		rounds = ""; prounds = ""; c = 0
		for (r = 1; r <= count[k]; r++) for (r2 = 1; r2 <= count[own]; r2++) if (round[own, r2] == round[k, r]) {
			q[++c] = rps[own, r2] / rps[k, r]; rounds = rounds sprintf("%s%.2f", c > 1 ? " " : "", q[c])
			pq[c] = pcpu[own, r2] / pcpu[k, r]; prounds = prounds sprintf("%s%.2f", c > 1 ? " " : "", pq[c])
		}
		sc = "–"
		if ((own in scm) && (k in scm) && scm[k] > 0) sc = sprintf("%.2f", scm[own] / scm[k])
		printf "| %s | %s | %.2f | %s | %.2f | %.2f (%s) | %s | %.2f |\n", shape, store, median(q, c), rounds, pcm[own] / pcm[k],
			median(pq, c), prounds, sc, (ccm[own] + pcm[own] + scm[own]) / (ccm[k] + pcm[k] + scm[k])
	}
}
{
	k = $1 SUBSEP $2
	if (!(k in seen)) { seen[k] = 1; order[++n] = k }
	r = ++count[k]
	rps[k, r] = $4; p50[k, r] = $5; p99[k, r] = $6; pcpu[k, r] = $7; scpu[k, r] = $8
	bad[k] += $9; non2xx[k] += $10; round[k, r] = $3; ccpu[k, r] = $11
	if ($2 == "bare") bare[$1, $3] = $4
	if ($2 == "bare-default") bared[$1, $3] = $4
}
END {
	for (i = 1; i <= n; i++) {
		k = order[i]; split(k, f, SUBSEP); shape = f[1]; target = f[2]; c = count[k]
		rounds = ""
		for (r = 1; r <= c; r++) {
			q[r] = rps[k, r] / bare[shape, round[k, r]]
			rounds = rounds sprintf("%s%.2f", r > 1 ? " " : "", q[r])
		}
		ratio = median(q, c)
		if ((shape, round[k, 1]) in bared) {
			for (r = 1; r <= c; r++) d[r] = rps[k, r] / bared[shape, round[k, r]]
			vd[k] = median(d, c)
		}
		for (r = 1; r <= c; r++) a[r] = rps[k, r]; thr = median(a, c)
		for (r = 1; r <= c; r++) a[r] = p50[k, r]; l50 = median(a, c)
		for (r = 1; r <= c; r++) a[r] = p99[k, r]; l99 = median(a, c)
		for (r = 1; r <= c; r++) a[r] = pcpu[k, r]; pc = median(a, c)
		if (target == "bare") barecpu[shape] = pc
		if (target == "bare-default") baredcpu[shape] = pc
		pcm[k] = pc
		for (r = 1; r <= c; r++) a[r] = ccpu[k, r]; cc = median(a, c); ccm[k] = cc
		sc = "–"
		if (scpu[k, 1] != "-") { for (r = 1; r <= c; r++) a[r] = scpu[k, r]; m = median(a, c); scm[k] = m; sc = sprintf("%.0f µs (%.2f)", m, m / barecpu[shape]) }
		name[k] = target == "bare" ? "bare reverse proxy" : target == "bare-default" ? "bare, DefaultTransport" : target == "static" ? "static answer, no proxy" : target ~ /^peer-/ ? "peer, " substr(target, 6) : target ~ /^minimal-/ ? "minimal layer, " substr(target, 9) : "idem, " target
		printf "| %s | %s | %.2f | %s | %.0f | %s | %s | %.0f µs | %.2f | %s | %.0f µs | %d, %d |\n", shape,
			name[k], ratio, rounds, thr, ms(l50), ms(l99),
			pc, pc / barecpu[shape], sc, cc, bad[k], non2xx[k]
	}
	compare("", "peer-", "idem against the peer on the same store (idem / peer")
	compare("", "minimal-", "idem against the minimal layer on the same store (idem / minimal")
	compare("peer-", "minimal-", "the peer against the minimal layer on the same store (peer / minimal")
	if (length(baredcpu) == 0) exit
	printf "\nAgainst the bare proxy on http.DefaultTransport (medians of the same rounds):\n\n"
	print "| shape | target | throughput vs default bare | proxy CPU/req vs default bare | store CPU/req vs default bare |"
	print "|---|---|---|---|---|"
	for (i = 1; i <= n; i++) {
		k = order[i]; split(k, f, SUBSEP); shape = f[1]; target = f[2]
		if (target == "bare-default") continue
		printf "| %s | %s | %.2f | %.2f | %s |\n", shape, name[k], vd[k], pcm[k] / baredcpu[shape],
			(k in scm) ? sprintf("%.2f", scm[k] / baredcpu[shape]) : "–"
	}
}' "$results"

if [ -s "$floors" ]; then
	echo
	echo "The floor under a PostgreSQL new key (pgbench, each statement its own commit: a table with only the primary key, and the same statements on idem's table) against idem's PostgreSQL CPU per new key:"
	echo
	echo "| round | floor pairs/s | floor PostgreSQL CPU per pair | on idem's table: pairs/s | CPU per pair | idem's PostgreSQL CPU per new key | idem / floor | idem / floor on idem's table |"
	echo "|---|---|---|---|---|---|---|---|"
	awk 'NR == FNR { if ($1 == "new" && $2 == "postgres") idem[$3] = $8; next }
		{ rate[$1, $4] = $2; cpu[$1, $4] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
		END { for (i = 1; i <= n; i++) { r = order[i]
			printf "| %s | %s | %.0f µs | %s | %.0f µs | %.0f µs | %.2f | %.2f |\n", r, rate[r, "floor"], cpu[r, "floor"],
				rate[r, "table"], cpu[r, "table"], idem[r], idem[r] / cpu[r, "floor"], cpu[r, "table"] ? idem[r] / cpu[r, "table"] : 0 } }' "$results" "$floors"
fi
