#!/usr/bin/env bash
# Runs the README's shell blocks as a new user would: in a fresh copy of the
# repository, in order, in one shell session (background jobs started by one
# block live on in the next), and checks what they printed. CI runs it alone
# (.ci/run), after the tests: the blocks use the README's fixed ports.
#
# A comment line just before a block changes how it runs:
#   <!-- readme-blocks: skip (why) -->            not run
#   <!-- readme-blocks: foreground until "TEXT" -->
#       a foreground server: run until it prints TEXT, then stopped with
#       SIGINT to its process group, as Ctrl-C in a terminal does.
#
# Bounded: the whole session gets READMEBLOCKS_TIMEOUT seconds (default 600);
# every process it started is killed at the end, whatever happened.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
timeout_s=${READMEBLOCKS_TIMEOUT:-600}
ports=(8080 8081 8090 9000 9090)

for port in "${ports[@]}"; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		echo "readme-blocks: 127.0.0.1:$port is in use; the README's blocks need it free" >&2
		exit 1
	fi
done

work=$(mktemp -d /tmp/idem-readme-XXXXXX)
session_pid=
cleanup() {
	if [[ -n $session_pid ]]; then
		kill -KILL -- "-$session_pid" 2>/dev/null || true
	fi
	# Foreground blocks ran in process groups of their own.
	if [[ -f $work/fg-pgids ]]; then
		while read -r pgid; do kill -KILL -- "-$pgid" 2>/dev/null || true; done <"$work/fg-pgids"
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# A fresh copy: the files git tracks (as they are in the work tree) and the
# untracked ones it does not ignore; no databases, no binaries.
clone=$work/idem
mkdir -p "$clone"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard) |
	(cd "$repo" && xargs -0 cp --parents -t "$clone" 2>/dev/null || true)
rm -f "$clone"/*.db "$clone"/*.db-wal "$clone"/*.db-shm
(cd "$clone" && find . -type f | sort) >"$work/files-before"

# The session script: the blocks in order.
session=$work/session.sh
awk -v fgids="$work/fg-pgids" '
BEGIN {
	print "set -eu"
	print "run_foreground() { # until-text, block"
	print "  local until=$1 log; log=$(mktemp)"
	print "  setsid bash -c \"$2\" >\"$log\" 2>&1 &"
	print "  local pid=$!; echo \"$pid\" >>\"" fgids "\""
	print "  for _ in $(seq 1 300); do grep -qF -- \"$until\" \"$log\" && break; kill -0 \"$pid\" 2>/dev/null || break; sleep 1; done"
	print "  cat \"$log\""
	print "  grep -qF -- \"$until\" \"$log\" || { echo \"readme-blocks: the foreground block never printed: $until\" >&2; return 1; }"
	print "  kill -INT -- \"-$pid\" 2>/dev/null || true"
	print "  for _ in $(seq 1 30); do kill -0 \"$pid\" 2>/dev/null || break; sleep 1; done"
	print "  if kill -0 \"$pid\" 2>/dev/null; then echo \"readme-blocks: the foreground block did not stop on SIGINT\" >&2; return 1; fi"
	print "}"
}
/^<!-- readme-blocks: skip/ { mode = "skip"; next }
/^<!-- readme-blocks: foreground until "/ {
	mode = "fg"; until = $0
	sub(/^<!-- readme-blocks: foreground until "/, "", until); sub(/" -->$/, "", until)
	next
}
/^```sh$/ && !inblock { inblock = 1; n++; body = ""; next }
/^```$/ && inblock {
	inblock = 0
	if (mode == "skip") { print "# block " n ": skipped" }
	else if (mode == "fg") {
		print "echo \"readme-blocks: block " n " (foreground)\" >&2"
		print "run_foreground \"" until "\" " sq(body)
	} else {
		print "echo \"readme-blocks: block " n "\" >&2"
		printf "%s", body
	}
	mode = ""
	next
}
inblock { body = body $0 "\n"; next }
function sq(s) { gsub(/\047/, "\047\\\047\047", s); return "\047" s "\047" }
' "$repo/README.md" >"$session"

echo "readme-blocks: running $(grep -c '^echo "readme-blocks: block' "$session") blocks in $clone (bound ${timeout_s}s)" >&2
out=$work/out.txt
set +e
(cd "$clone" && exec setsid timeout -s KILL "$timeout_s" bash "$session") >"$out" 2>&1 &
session_pid=$!
wait "$session_pid"
code=$?
set -e
cat "$out"
if [[ $code -ne 0 ]]; then
	echo "readme-blocks: the session failed with exit status $code" >&2
	exit 1
fi

# The teardown block stopped everything the session started: no port is
# served any more (the cleanup would kill what is left, hiding a teardown
# that forgot something).
for port in "${ports[@]}"; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		echo "readme-blocks: 127.0.0.1:$port is still served after the session: its teardown missed a server" >&2
		exit 1
	fi
done
# Every file the session made is in .gitignore: a clone stays clean.
(cd "$clone" && find . -type f | sort) >"$work/files-after"
while read -r f; do
	if ! git -C "$repo" check-ignore -q --no-index -- "${f#./}"; then
		echo "readme-blocks: the session made ${f#./}, which .gitignore does not name" >&2
		exit 1
	fi
done < <(comm -13 "$work/files-before" "$work/files-after")

# What a reader is told to expect.
fail=0
expect() { # description, fixed text
	if ! grep -qF -- "$2" "$out"; then
		echo "readme-blocks: missing: $1 ($2)" >&2
		fail=1
	fi
}
expect "the start-up demo replays a retry" "Idempotent-Replayed: true"
expect "the version" "module    github.com/idem-dev/idem"
expect "the payment is created" "HTTP/1.1 201 Created"
expect "the load run against payments is accepted" "status      201:"
expect "migrate status lists the payments set" "payments (payments_migrations)"
expect "the proxy's demo upstream echoes the request" '"body":{"amount_cents":500}'
expect "the proxy refuses another body with the same key" "key-reused"
expect "trends.json answers" '"minutes": ['
# The first session's ledger (its first JSON array of charges) holds the
# one charge of order-1001: the session has a database of its own.
ledger=$(grep -m1 '^\[{"seq":' "$out" || true)
if [[ $(grep -o '"idempotency_key"' <<<"$ledger" | wc -l) -ne 1 ]]; then
	echo "readme-blocks: want one charge in the first session's ledger, got: ${ledger:-nothing}" >&2
	fail=1
fi
# `idem keys list --key order-1001` finds the payment's record after the
# load's newer keys.
if ! grep -Eq '^shop +POST /v1/payments +order-1001 +completed +1 ' "$out"; then
	echo "readme-blocks: idem keys list --key order-1001 did not list the completed record" >&2
	fail=1
fi
# The background servers log to files: the load run's requests do not reach
# the terminal (they made thousands of INFO lines).
if [[ $(grep -c 'level=INFO' "$out") -gt 50 ]]; then
	echo "readme-blocks: $(grep -c 'level=INFO' "$out") INFO log lines in the session's output: a background server logs to the terminal" >&2
	fail=1
fi
if [[ $(grep -c "Idempotent-Replayed: true" "$out") -lt 3 ]]; then
	echo "readme-blocks: want a replay from the demo, the payments retry and the proxy retry" >&2
	fail=1
fi
if [[ $fail -ne 0 ]]; then exit 1; fi
echo "readme-blocks: ok" >&2
