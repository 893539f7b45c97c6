#!/usr/bin/env bash
# pgshapes.sh: PostgreSQL's CPU per new key under pgbench, by table and
# statement shape (run by hand, never in CI).
#
# Each variant is a table and a pgbench script of two statements, each its
# own commit: the reservation of a new key and its completion. pgbench runs
# them with prepared statements and CONNECTIONS clients for DURATION seconds,
# variants alternating in ROUNDS rounds; the script prints, per run, the
# pairs per second and the CPU (user + system, /proc/PID/stat) of the
# PostgreSQL backends per pair, found by application_name, then the median
# per variant, the HOT updates and, from pg_stat_statements, the WAL bytes
# and records per statement. Variants (VARIANTS):
#
#   floor   the floor: INSERT and UPDATE by primary key on a table of idem's
#           columns with only the primary key (as proxy.sh's PG_FLOOR)
#   plain   the same two statements on idem's table (its migrations)
#   idem    idem's reserve (with find) and complete statements
#           (queries.sql, the parameters written in) on idem's table
#   plainN, idemN  the same on idem's table migrated only up to migration N
#           (e.g. plain3, idem3: before a later migration), idemN with the
#           statements of the file OLD_QUERIES if set (queries.sql as it
#           was then: git show REV:idempgx/queries.sql)
#   plainx, idemx  the same after the statements of the file EXTRA_SQL
#           ({{schema}} filled in), e.g. other indexes
#   reserve idem's reserve statement and the plain UPDATE, on idem's table
#   complete  the plain INSERT and idem's complete statement, on idem's table
#   NAME    any other name: the pgbench script SCRIPTS/NAME.sql on idem's
#           table, {{schema}} filled in
#
# Settings: ROUNDS=3 DURATION=10 CONNECTIONS=16 THREADS=2
# VARIANTS="floor plain idem" FILLFACTOR (of idem's table, default none)
# IDEM_TEST_DATABASE_URL (default: the private cluster, 127.0.0.1:55432);
# the run creates and drops its own schemas (TAG, default pgshapes_PID).
# SETUP_ONLY=DIR creates the schemas, writes the scripts into DIR and stops,
# leaving the schemas (to run the scripts another way, e.g. under callgrind).
set -euo pipefail

cd "$(dirname "$0")/../.."
PG_URL=${IDEM_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:55432/test?sslmode=disable}
ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-10} CONNECTIONS=${CONNECTIONS:-16} THREADS=${THREADS:-2}
VARIANTS=${VARIANTS:-floor plain idem}
TAG=${TAG:-pgshapes_$$}
work=$(mktemp -d /tmp/pgshapes.XXXXXX)
hz=$(getconf CLK_TCK)

cleanup() {
	[ -z "${SETUP_ONLY:-}" ] || { rm -rf "$work"; return; }
	for v in $VARIANTS; do
		psql -q "$PG_URL" -c "DROP SCHEMA IF EXISTS ${TAG}_$v CASCADE" >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

# columns: the record's column list, as queries.go's columns.
columns=$(awk '/^const columns = `/ { on = 1; sub(/^const columns = `/, "") } on { if (sub(/`$/, "")) { print; exit } print }' idempgx/queries.go)
notify=$(awk '/^const notifyPayloadSQL = `/ { on = 1; sub(/^const notifyPayloadSQL = `/, "") } on { if (sub(/`$/, "")) { print; exit } print }' idempgx/queries.go)

# expand SCHEMA: fills queries.sql's and the migrations' placeholders.
expand() {
	COLUMNS_SQL=$columns NOTIFY_SQL=$notify NOTIFY_K_SQL=${notify//u./k.} SCHEMA=$1 perl -0pe '
		s/\{\{schema\}\}/$ENV{SCHEMA}/g; s/\{\{columns\}\}/$ENV{COLUMNS_SQL}/g;
		s/\{\{channel\}\}/'"'"'idem_bench'"'"'/g; s/\{\{notify_payload\}\}/$ENV{NOTIFY_SQL}/g; s/\{\{notify_payload_k\}\}/$ENV{NOTIFY_K_SQL}/g;
		s/\{\{partition_by\}\}//g; s/\{\{partitions\}\}//g'
}

# statement NAME: the statement NAME of queries.sql, without comments.
statement() {
	awk -v name="$1" '/^-- name: / { on = ($3 == name); next } on && !/^[[:space:]]*--/' "${queries:-idempgx/queries.sql}" |
		sed 's/[[:space:]]--.*$//'
}

# terminate: ends a statement with exactly one semicolon. (pgbench sends an
# empty statement, a ";" after another, to the server as one more round
# trip: some 12,000 instructions of the server each, counted against idem.)
terminate() {
	perl -0pe 's/;?\s*\z/;\n/'
}

# params VALUES...: writes the values in for $1, $2 … (each in parentheses).
params() {
	local args=("$@")
	perl -pe 'BEGIN { @v = @ARGV; @ARGV = () } s/\$(\d+)/"(" . $v[$1 - 1] . ")"/ge' "${args[@]}"
}

key="'k-' || :k"
fp="'9f2c4e7b1a3d5f6e8c0b2a4d6f8e1c3b5a7d9f0e2c4b6a8d1f3e5c7b9a0d2f4e'"
token="'5f0c2a7e9b1d3f6a8c4e0b2d7f9a1c3e'"
header="'{\"Content-Type\": [\"application/json\"]}'"
body="'{\"method\":\"POST\",\"path\":\"/v1/payments\",\"body\":{\"customer_id\":\"cus_bench\",\"amount_cents\":1999,\"currency\":\"EUR\"}}'::bytea"

plain_script() {
	cat <<SQL
\\set k random(1, 9000000000000000)
INSERT INTO $1.idem_keys (scope, endpoint, key, fingerprint, state, token, locked_until, started_at,
	lease_expired_state, attempts, created_at, updated_at, expires_at, ttl)
	VALUES ('', 'POST /v1/payments', $key, $fp, 'in_progress',
	$token, now() + interval '30 seconds', now(), 'unknown', 1, now(), now(),
	now() + interval '24 hours', interval '24 hours');
UPDATE $1.idem_keys SET state = 'completed', response_status = 201,
	response_header = $header, response_body = $body, updated_at = now()
	WHERE scope = '' AND endpoint = 'POST /v1/payments' AND key = $key;
SQL
}

plain_insert() {
	plain_script "$1" | sed -n '1,/;$/p'
}

plain_update() {
	plain_script "$1" | sed '1,/;$/d'
}

# idem_reserve SCHEMA: the reserve statement and, when queries.sql has it,
# find, which KeyReserve sends with it in one round trip and one implicit
# transaction: a pgbench pipeline (one Sync).
# The order of reserve's parameters is read from its comment: the token
# came fifth, after the fingerprint, until find took it.
idem_reserve() {
	local first=$fp second=$token find
	if awk '/^-- name: / { on = ($3 == "reserve"); next } on' "${queries:-idempgx/queries.sql}" | grep -q '\$4 token'; then
		first=$token second=$fp
	fi
	find=$(statement find)
	[ -z "$find" ] || echo '\startpipeline'
	statement reserve | expand "$1" | params "''" "'POST /v1/payments'" "$key" "$first" "$second" "now()" \
		"now() + interval '30 seconds'" "now() + interval '24 hours'" "'unknown'" "interval '24 hours'" | terminate
	if [ -n "$find" ]; then
		statement find | expand "$1" | params "''" "'POST /v1/payments'" "$key" "$token" | terminate
		echo '\endpipeline'
	fi
}

idem_complete() {
	statement complete | expand "$1" | params "''" "'POST /v1/payments'" "$key" "$token" "now()" 201 \
		"$header" "$body" false | terminate
}

idem_script() {
	echo '\set k random(1, 9000000000000000)'
	idem_reserve "$1"
	idem_complete "$1"
}

# setup VARIANT: creates the variant's schema and writes its script.
setup() {
	local v=$1 schema=${TAG}_$1 upto
	psql -q "$PG_URL" -c "DROP SCHEMA IF EXISTS $schema CASCADE" -c "CREATE SCHEMA $schema" >/dev/null
	case $v in
	floor)
		psql -q "$PG_URL" -c "CREATE TABLE $schema.idem_keys (
			scope text COLLATE \"C\" NOT NULL, endpoint text COLLATE \"C\" NOT NULL, key text COLLATE \"C\" NOT NULL,
			fingerprint text NOT NULL, state text NOT NULL, token text NOT NULL, locked_until timestamptz NOT NULL,
			started_at timestamptz NOT NULL, lease_expired_state text NOT NULL, response_status integer,
			response_header jsonb, response_body bytea, not_replayable boolean NOT NULL DEFAULT false,
			recovery_point text NOT NULL DEFAULT '', attempts integer NOT NULL DEFAULT 1,
			created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
			waiters boolean NOT NULL DEFAULT false, ttl interval, reconcile_after timestamptz,
			reconcile_attempts integer NOT NULL DEFAULT 0, reconcile_error text NOT NULL DEFAULT '',
			PRIMARY KEY (scope, endpoint, key))" >/dev/null
		plain_script "$schema" >"$work/$v.sql"
		return
		;;
	plain* | idem*)
		upto=${v#plain}
		upto=${upto#idem}
		[ "$upto" != x ] || upto=
		local f n
		for f in idempgx/migrations/*.up.sql; do
			n=$((10#$(basename "$f" | cut -d_ -f1)))
			[ -z "$upto" ] || [ "$n" -le "$upto" ] || continue
			expand "$schema" <"$f" | psql -q -v ON_ERROR_STOP=1 "$PG_URL" >/dev/null
		done
		case $v in *x) expand "$schema" <"$EXTRA_SQL" | psql -q -v ON_ERROR_STOP=1 "$PG_URL" >/dev/null ;; esac
		[ -z "${FILLFACTOR:-}" ] || psql -q "$PG_URL" -c "ALTER TABLE $schema.idem_keys SET (fillfactor = $FILLFACTOR)" >/dev/null
		;;
	*)
		local f
		for f in idempgx/migrations/*.up.sql; do
			expand "$schema" <"$f" | psql -q -v ON_ERROR_STOP=1 "$PG_URL" >/dev/null
		done
		;;
	esac
	case $v in
	plain*) plain_script "$schema" >"$work/$v.sql" ;;
	idem[0-9]*) queries=${OLD_QUERIES:-} idem_script "$schema" >"$work/$v.sql" ;;
	idem*) idem_script "$schema" >"$work/$v.sql" ;;
	reserve) { plain_insert "$schema" | head -1; idem_reserve "$schema"; plain_update "$schema"; } >"$work/$v.sql" ;;
	complete) { plain_insert "$schema"; idem_complete "$schema"; } >"$work/$v.sql" ;;
	*) expand "$schema" <"$SCRIPTS/$v.sql" >"$work/$v.sql" ;;
	esac
}

ticks() {
	local pid
	for pid in "$@"; do
		[ -r "/proc/$pid/stat" ] || continue
		{ sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null || true; } | awk -v pid="$pid" 'NF { print pid, $12 + $13 }'
	done
}

pids() {
	psql -At "$PG_URL" -c "SELECT pid FROM pg_stat_activity WHERE application_name = '${TAG}_$1'"
}

# run VARIANT ROUND: one pgbench run; appends "variant round pairs/s us/pair".
run() {
	local v=$1 out=$work/$1.out samples=$work/samples
	: >"$samples"
	PGAPPNAME=${TAG}_$v pgbench -n -M prepared -c "$CONNECTIONS" -j "$THREADS" -T "$DURATION" \
		-f "$work/$v.sql" "$PG_URL" >"$out" 2>&1 &
	local bench=$!
	(
		while :; do
			# shellcheck disable=SC2046
			ticks $(pids "$v") >>"$samples"
			sleep 0.5
		done
	) &
	local sampler=$!
	wait "$bench" || { cat "$out" >&2; kill "$sampler"; exit 1; }
	kill "$sampler" 2>/dev/null || true
	wait "$sampler" 2>/dev/null || true
	# A backend's largest count is its ticks at the end (they start at zero:
	# every backend is new).
	local st pairs
	st=$(awk '{ if ($2 > last[$1]) last[$1] = $2 } END { for (p in last) s += last[p]; print s + 0 }' "$samples")
	pairs=$(awk -F': ' '/^number of transactions actually processed/ { split($2, a, "/"); print a[1] }' "$out")
	awk -v v="$v" -v r="$2" -v pairs="$pairs" -v st="$st" -v hz="$hz" \
		'/^tps = / { printf "%s %s %.0f %.1f\n", v, r, $3, st * 1e6 / hz / pairs }' "$out" | tee -a "$work/results"
}

for v in $VARIANTS; do
	setup "$v"
done
if [ -n "${SETUP_ONLY:-}" ]; then
	mkdir -p "$SETUP_ONLY"
	for v in $VARIANTS; do
		cp "$work/$v.sql" "$SETUP_ONLY/$v.sql"
	done
	exit 0
fi
psql -q "$PG_URL" -c "SELECT pg_stat_statements_reset()" >/dev/null
echo "pgshapes.sh: $ROUNDS rounds of ${DURATION}s, $CONNECTIONS clients; per run: variant round pairs/s us_cpu/pair (load $(cut -d ' ' -f 1-3 /proc/loadavg))"
for round in $(seq 1 "$ROUNDS"); do
	for v in $VARIANTS; do
		run "$v" "$round"
	done
done
echo
echo "median us of PostgreSQL CPU per pair (load $(cut -d ' ' -f 1-3 /proc/loadavg) at the end):"
awk '{ a[$1] = a[$1] " " $4; n[$1]++ } END { for (v in a) print v, a[v] }' "$work/results" |
	while read -r v xs; do
		# shellcheck disable=SC2086
		printf '%s %s (%s)\n' "$v" "$(printf '%s\n' $xs | sort -n | awk '{ x[NR] = $1 } END { print (NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2) }')" "$xs"
	done
echo
echo "HOT updates:"
for v in $VARIANTS; do
	psql -At "$PG_URL" -c "SELECT '$v', n_tup_upd, n_tup_hot_upd, round(100.0 * n_tup_hot_upd / greatest(n_tup_upd, 1), 1) || '%'
		FROM pg_stat_user_tables WHERE schemaname = '${TAG}_$v' AND relname = 'idem_keys'"
done
echo
echo "per statement (pg_stat_statements): variant calls exec_us wal_bytes wal_records shared_blks_hit+dirtied query"
for v in $VARIANTS; do
	psql -At -F ' ' "$PG_URL" -c "SELECT '$v', calls, round((total_exec_time * 1000 / calls)::numeric, 1),
		round(wal_bytes / calls, 0), round(wal_records::numeric / calls, 2),
		round((shared_blks_hit + shared_blks_read)::numeric / calls, 1) || '+' || round(shared_blks_dirtied::numeric / calls, 2),
		left(regexp_replace(query, '\s+', ' ', 'g'), 40)
		FROM pg_stat_statements WHERE query LIKE '%${TAG}_$v.%' AND calls > 100 ORDER BY query"
done
