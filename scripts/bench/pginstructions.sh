#!/usr/bin/env bash
# pginstructions.sh: PostgreSQL's instructions per new key, by table and
# statement shape, counted by callgrind (run by hand, never in CI).
#
# The CPU time of pgbench's backends (pgshapes.sh) moves with the machine's
# load; instruction counts do not. This script creates a private PostgreSQL
# cluster in a temporary directory (initdb, as the user postgres when run as
# root), sets up the variants of pgshapes.sh there (VARIANTS, the same
# names), and runs each variant's two statements in a single-user backend
# (postgres --single, prepared with PREPARE, each statement its own
# transaction) under valgrind --tool=callgrind, N1 and then N2 times; the
# instructions per pair are the difference divided by N2 - N1, so that the
# backend's start and end cancel out. One backend, no concurrency: the
# commit's WAL write is counted but no fsync wait, lock wait or network.
#
# MODE=server counts the statements as a client sends them instead: the
# cluster runs under callgrind (every backend its own file) and pgbench
# -M prepared, one client, runs each variant's script over a socket, N1
# and then N2 transactions (keys drawn with a fixed seed); the backend's
# count (the new file with the largest) gives the instructions per pair
# the same way. Bind and Execute of a prepared statement instead of
# EXECUTE, find in the same pipeline and transaction as reserve, rows sent
# as a client asks for them (pgbench: text) instead of printed.
#
# Settings: MODE (single or server, default single),
# VARIANTS="floor plain idem" N1=100 N2=600 PGBIN (default: the
# directory of pg_config --bindir), PORT (of the temporary cluster, default
# 55498: set another to run two at once), KEEP=DIR (copies the callgrind
# files there, for callgrind_annotate), SCRIPTS and the rest as pgshapes.sh.
set -euo pipefail

cd "$(dirname "$0")/../.."
. scripts/bench/callgrindserver.sh
VARIANTS=${VARIANTS:-floor plain idem}
N1=${N1:-100} N2=${N2:-600}
PGBIN=${PGBIN:-$(pg_config --bindir)}
PORT=${PORT:-55498}
work=$(mktemp -d /tmp/pginstructions.XXXXXX)
chmod 755 "$work"
as_pg() {
	if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else bash -c "$*"; fi
}
[ "$(id -u)" != 0 ] || chown postgres "$work"
cleanup() {
	as_pg "$PGBIN/pg_ctl -D $work/data -m immediate stop" >/dev/null 2>&1 || true
	rm -rf "$work" 2>/dev/null || { sleep 3; rm -rf "$work"; } # callgrind's last files
}
trap cleanup EXIT

as_pg "$PGBIN/initdb -D $work/data -U postgres --auth=trust" >"$work/initdb.log"
as_pg "$PGBIN/pg_ctl -D $work/data -o '-p $PORT -k $work -c listen_addresses=127.0.0.1 -c fsync=off' -l $work/log -w start" >/dev/null
psql -q "postgres://postgres@127.0.0.1:$PORT/postgres" -c "CREATE DATABASE test"
IDEM_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$PORT/test?sslmode=disable" TAG=pgi SETUP_ONLY="$work/scripts" \
	VARIANTS="$VARIANTS" scripts/bench/pgshapes.sh >/dev/null 2>&1
as_pg "$PGBIN/pg_ctl -D $work/data -w stop" >/dev/null

# input SCRIPT N OFFSET: single-user input that prepares the statements of
# a pgbench script (its :k a parameter) and executes them N times with keys
# from OFFSET.
input() {
	perl -e '
		my ($n, $off) = @ARGV[1, 2];
		local $/; open my $f, "<", $ARGV[0] or die; my $src = <$f>;
		$src =~ s/\A\\set[^\n]*\n//;
		$src =~ s/^\\(?:start|end)pipeline[^\n]*\n//mg;
		my @st = grep { /\S/ } split /;\s*\n/, $src;
		my @out;
		for my $i (0 .. $#st) { (my $s = $st[$i]) =~ s/:k\b/\$1/g; push @out, "PREPARE s$i(bigint) AS $s" }
		for my $j (0 .. $n - 1) { push @out, map { "EXECUTE s$_(" . ($off + $j) . ")" } 0 .. $#st }
		print join(";\n\n", @out), ";\n\n";
	' "$@"
}

# count VARIANT N OFFSET: the instructions of a single-user backend running
# N pairs.
count() {
	local in=$work/in.$1.$2 out=$work/cg.$1.$2
	input "$work/scripts/$1.sql" "$2" "$3" >"$in"
	chmod 644 "$in"
	as_pg "valgrind --tool=callgrind --callgrind-out-file=$out $PGBIN/postgres --single -j -D $work/data -c fsync=off test <$in >$work/out.$1.$2 2>&1"
	if grep -q ERROR "$work/out.$1.$2"; then
		grep -m 3 ERROR "$work/out.$1.$2" >&2
		exit 1
	fi
	[ -z "${KEEP:-}" ] || cp "$out" "$KEEP/callgrind.$1.$2"
	awk '/^(summary|totals):/ { print $2; exit }' "$out"
}

if [ "${MODE:-single}" = server ]; then
	mkdir "$work/cg"
	chmod 777 "$work/cg"
	as_pg "valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=$work/cg/cg.%p $PGBIN/postgres -D $work/data \
		-p $PORT -k $work -c listen_addresses=127.0.0.1 -c fsync=off -c autovacuum=off >$work/valgrind.log 2>&1 &"
	url="postgres://postgres@127.0.0.1:$PORT/test"
	for _ in $(seq 120); do
		psql -q "$url" -c 'SELECT 1' >/dev/null 2>&1 && break
		sleep 1
	done
	sleep 3 # the file of psql's backend
	# serve VARIANT N: the instructions of the backend of a pgbench run of
	# N transactions.
	serve() {
		local before f
		before=$(ls "$work/cg")
		pgbench -n -M prepared -c 1 -t "$2" --random-seed="$2" -f "$work/scripts/$1.sql" "$url" >"$work/pgbench.$1.$2" 2>&1 ||
			{ cat "$work/pgbench.$1.$2" >&2; exit 1; }
		sleep 2
		f=$(newest_backend "$work/cg" "$before")
		[ -z "${KEEP:-}" ] || cp "$work/cg/$f" "$KEEP/callgrind.server.$1.$2"
		awk '/^(summary|totals):/ { print $2; exit }' "$work/cg/$f"
	}
	echo "pginstructions.sh: instructions per pair of a backend under pgbench -M prepared, ($N2 - $N1) pairs"
	for v in $VARIANTS; do
		a=$(serve "$v" "$N1")
		b=$(serve "$v" "$N2")
		echo "$v $(((b - a) / (N2 - N1)))"
	done
	exit 0
fi

echo "pginstructions.sh: instructions per pair of a single-user backend, ($N2 - $N1) pairs"
# Every variant (its own schema) gets the same keys, of the same length:
# the N1 pairs from 1000000 and the N2 pairs from 2000000.
for v in $VARIANTS; do
	a=$(count "$v" "$N1" 1000000)
	b=$(count "$v" "$N2" 2000000)
	echo "$v $(((b - a) / (N2 - N1)))"
done
