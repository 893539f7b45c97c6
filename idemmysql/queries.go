package idemmysql

import (
	"embed"
	"fmt"
	"strings"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/sqlfile"
)

//go:embed queries.sql
var queriesSQL string

//go:embed migrations/*.sql
var migrationsFS embed.FS

// columns is the record's column list, in the order recordScan reads it.
const columns = `k.scope, k.endpoint, k.idem_key, k.fingerprint, k.state, k.token,
    k.locked_until, k.started_at, k.lease_expired_state, k.response_status,
    k.response_header, k.response_body, k.not_replayable, k.recovery_point,
    k.attempts, k.created_at, k.updated_at, k.expires_at, k.ttl,
    k.reconcile_after, k.reconcile_attempts, k.reconcile_error`

// placeholders fills the {{…}} placeholders of queries.sql.
var placeholders = strings.NewReplacer(
	"{{columns}}", columns,
	"{{id}}", `k.scope = :scope AND k.endpoint = :endpoint AND k.idem_key = :key`,
	"{{ids}}", `(k.scope, k.endpoint, k.idem_key) IN (:ids)`,
	"{{live}}", `(k.expires_at > :now OR k.state = 'unknown'
       OR (k.state = 'in_progress' AND k.locked_until <= :now
           AND k.lease_expired_state = 'unknown'))`,
)

// stateNow is a record's state as a reader sees it at :now: an expired lease
// in the state it turns into.
const stateNow = `(CASE WHEN k.state = 'in_progress' AND k.locked_until <= :now
    THEN k.lease_expired_state ELSE k.state END)`

// A stmt is a statement of queries.sql compiled for binding: its text split
// at its named parameters.
type stmt struct {
	// text has one more element than names: text[0] names[0] text[1] ….
	text  []string
	names []string
}

// compile drops the comment lines of sql and splits it at its named
// parameters (":name", outside quoted strings).
func compile(sql string) stmt {
	var b strings.Builder
	for line := range strings.Lines(sql) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
		}
	}
	sql = strings.TrimSpace(b.String())
	var st stmt
	start, quoted := 0, false
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case c == '\'':
			quoted = !quoted
		case c == ':' && !quoted && i+1 < len(sql) && isNameByte(sql[i+1]):
			j := i + 1
			for j < len(sql) && isNameByte(sql[j]) {
				j++
			}
			st.text = append(st.text, sql[start:i])
			st.names = append(st.names, sql[i+1:j])
			start, i = j, j-1
		}
	}
	st.text = append(st.text, sql[start:])
	return st
}

func isNameByte(c byte) bool { return c == '_' || 'a' <= c && c <= 'z' }

// args are a statement's arguments by name. An []idemstore.Identity
// argument stands for a list of rows, ":ids" in "(…) IN (:ids)".
type args map[string]any

// bind returns st's SQL with "?" for each parameter and the arguments in
// their order. It panics on a parameter without an argument: a bug.
func (st stmt) bind(a args) (string, []any) {
	var b strings.Builder
	out := make([]any, 0, len(st.names))
	for i, name := range st.names {
		b.WriteString(st.text[i])
		v, ok := a[name]
		if !ok {
			panic(fmt.Sprintf("idemmysql: no argument for :%s", name))
		}
		if ids, ok := v.([]idemstore.Identity); ok {
			for j, id := range ids {
				if j > 0 {
					b.WriteString(", ")
				}
				b.WriteString("(?, ?, ?)")
				out = append(out, bin(id.Scope), bin(id.Endpoint), bin(id.Key))
			}
			continue
		}
		b.WriteString("?")
		out = append(out, v)
	}
	b.WriteString(st.text[len(st.names)])
	return b.String(), out
}

// statements of queries.sql, by name, compiled.
var statements = func() map[string]stmt {
	raw := sqlfile.MustParse("idemmysql/queries.sql", queriesSQL)
	out := make(map[string]stmt, len(raw))
	for name, sql := range raw {
		out[name] = compile(placeholders.Replace(sql))
	}
	return out
}()

// query returns the compiled statement name of queries.sql.
func query(name string) stmt {
	st, ok := statements[name]
	if !ok {
		panic(fmt.Sprintf("idemmysql: no statement %q in queries.sql", name))
	}
	return st
}

// The statements, looked up once.
var (
	qReserve        = query("reserve")
	qReclaim        = query("reclaim")
	qGet            = query("get")
	qComplete       = query("complete")
	qRelease        = query("release")
	qMarkUnknown    = query("mark_unknown")
	qDelete         = query("delete")
	qRenew          = query("renew")
	qCheckpoint     = query("checkpoint")
	qResolve        = query("resolve")
	qReseal         = query("reseal")
	qSweepLock      = query("sweep_lock")
	qSweep          = query("sweep")
	qReapDone       = query("reap_done")
	qReapLive       = query("reap_live")
	qReap           = query("reap")
	qList           = query("list")
	qPurgeLock      = query("purge_lock")
	qPurge          = query("purge")
	qReconcileLock  = query("reconcile_lock")
	qReconcileClaim = query("reconcile_claim")
	qReconcileFail  = query("reconcile_fail")
	qBacklog        = query("backlog")
)

// bin is s as a binary argument: the driver sends it as _binary'…', which
// the VARBINARY columns compare byte for byte (a string argument would be a
// utf8mb4 literal, which must be valid UTF-8).
func bin(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return []byte(s)
}
