#!/usr/bin/env bash
# pgmultirow.sh: PostgreSQL's instructions per new key when a group's calls
# that share a statement go as one multi-row statement, against today's
# statements, counted by callgrind (run by hand, never in CI; as root or
# as the user postgres).
#
# As pginstructions.sh's MODE=server: a private cluster (initdb, PORT,
# default 55497) runs under callgrind, every backend its own file; a client
# (idempgx's TestMeasureMultiRow, built here) runs N1 and then N2 groups of
# G new keys on one connection, each group a reservation pipeline (reserve
# and find, one implicit transaction) and a completion pipeline, and the
# backend's count per new key is the difference divided by (N2 - N1) * G.
# Before the cluster runs under callgrind, the schema is migrated and holds
# POPULATE completed records (default 100,000), vacuumed and analyzed, so
# that the planner sees a table of some size. Forms (FORMS, see
# idempgx/multirow_measure_test.go): cur (today's statements, sent by the
# store's sender), pinned (one statement each over arrays, plans pinned),
# half (pinned reservations, today's completions), multi and lateral (plain
# unnest joins), ret (multi with RETURNING), cte (half's reservations, a
# group's completions as one statement of a data-modifying CTE per call,
# each complete's UPDATE; today's completion for a group of one), cte1 (cte
# returning one row of a column per call). GS="1 2 4 8" N1=20 N2=120
# PGOPTS (server options, e.g. "-c plan_cache_mode=force_generic_plan").
# CHECKS: forms of the table's idem_keys_response_check to measure in turn,
# each a file of scripts/bench/pgcheck/ run before its counts (default none:
# the schema as migrated), e.g. CHECKS="base none plpgsql".
set -euo pipefail

cd "$(dirname "$0")/../.."
. scripts/bench/callgrindserver.sh
PGBIN=${PGBIN:-$(pg_config --bindir)} PORT=${PORT:-55497}
FORMS=${FORMS:-cur pinned} CHECKS=${CHECKS:-} GS=${GS:-1 2 4 8} N1=${N1:-20} N2=${N2:-120}
work=$(mktemp -d /tmp/pgmultirow.XXXXXX)
chmod 755 "$work"
TEST=$work/idempgx.test
go test -c -o "$TEST" ./idempgx
as_pg() {
	if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else bash -c "$*"; fi
}
[ "$(id -u)" != 0 ] || chown postgres "$work"
cleanup() {
	as_pg "$PGBIN/pg_ctl -D $work/data -m immediate stop" >/dev/null 2>&1 || true
	rm -rf "$work" 2>/dev/null || { sleep 3; rm -rf "$work"; }
}
trap cleanup EXIT
as_pg "$PGBIN/initdb -D $work/data -U postgres --auth=trust" >"$work/initdb.log"
as_pg "$PGBIN/pg_ctl -D $work/data -o '-p $PORT -k $work -c listen_addresses=127.0.0.1 -c fsync=off' -l $work/log -w start" >/dev/null
psql -q "postgres://postgres@127.0.0.1:$PORT/postgres" -c "CREATE DATABASE test"
export IDEM_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$PORT/test?sslmode=disable" IDEM_PGMULTI_SCHEMA=pgmulti
IDEM_PGMULTI_SETUP=1 IDEM_PGMULTI_POPULATE=${POPULATE:-100000} $TEST -test.run TestMeasureMultiRow >/dev/null
as_pg "$PGBIN/pg_ctl -D $work/data -w stop" >/dev/null
mkdir "$work/cg"; chmod 777 "$work/cg"
as_pg "valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=$work/cg/cg.%p $PGBIN/postgres -D $work/data \
	-p $PORT -k $work -c listen_addresses=127.0.0.1 -c fsync=off -c autovacuum=off ${PGOPTS:-} >$work/valgrind.log 2>&1 &"
url="postgres://postgres@127.0.0.1:$PORT/postgres"
for _ in $(seq 120); do psql -q "$url" -c 'SELECT 1' >/dev/null 2>&1 && break; sleep 1; done
# The first backend of a database after a start builds its relation cache
# file (some 11 million instructions): a backend that is not counted.
IDEM_PGMULTI_FORM=cur IDEM_PGMULTI_G=1 IDEM_PGMULTI_N=1 $TEST -test.run TestMeasureMultiRow >/dev/null
sleep 3
serve() { # form g n
	local before f
	before=$(ls "$work/cg")
	IDEM_PGMULTI_FORM=$1 IDEM_PGMULTI_G=$2 IDEM_PGMULTI_N=$3 $TEST -test.run TestMeasureMultiRow >"$work/out" 2>&1 || { cat "$work/out" >&2; exit 1; }
	sleep 2
	f=$(newest_backend "$work/cg" "$before")
	[ -z "${KEEP:-}" ] || cp "$work/cg/$f" "$KEEP/cg.${check#-}.$1.$2.$3"
	awk '/^(summary|totals):/ { print $2; exit }' "$work/cg/$f"
}
echo "server instructions per new key (groups of g, ($N2 - $N1) groups), forms: $FORMS"
for check in ${CHECKS:--}; do
	if [ "$check" != - ]; then
		sed 's/{{schema}}/pgmulti/g' "scripts/bench/pgcheck/$check.sql" | psql -q -v ON_ERROR_STOP=1 "$IDEM_TEST_DATABASE_URL" >/dev/null
		sleep 2
	fi
	for g in $GS; do
		for form in $FORMS; do
			a=$(serve "$form" "$g" "$N1")
			b=$(serve "$form" "$g" "$N2")
			label=$form
			[ "$check" = - ] || label="$check $form"
			echo "$label g=$g $(((b - a) / (N2 - N1) / g))"
		done
	done
done
psql -At "$IDEM_TEST_DATABASE_URL" -c "select state, count(*) from pgmulti.idem_keys group by 1"
