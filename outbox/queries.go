package outbox

import (
	"embed"
	"fmt"
	"strings"

	"github.com/idem-dev/idem/internal/sqlfile"
)

//go:embed queries/postgres.sql
var postgresSQL string

//go:embed queries/sqlite.sql
var sqliteSQL string

//go:embed migrations/postgres/*.sql migrations/sqlite/*.sql migrations/mysql/*.sql
var migrationsFS embed.FS

// queries are one dialect's statements.
type queries struct {
	enqueue, claim, finish, unclaim, get, list, redrive, prune, counts string
}

// parseQueries reads the statements of a queries file and fills in the
// {{columns}} placeholder.
func parseQueries(src, columns string) (*queries, error) {
	m, err := sqlfile.Parse(src)
	if err != nil {
		return nil, err
	}
	q := func(name string) string {
		sql, ok := m[name]
		if !ok && err == nil {
			err = fmt.Errorf("no statement %q", name)
		}
		return strings.ReplaceAll(sql, "{{columns}}", columns)
	}
	out := &queries{
		enqueue: q("enqueue"),
		claim:   q("claim"),
		finish:  q("finish"),
		unclaim: q("unclaim"),
		get:     q("get"),
		list:    q("list"),
		redrive: q("redrive"),
		prune:   q("prune"),
		counts:  q("counts"),
	}
	return out, err
}

func mustParseQueries(dialect, src, columns string) *queries {
	q, err := parseQueries(src, columns)
	if err != nil {
		panic(fmt.Sprintf("outbox: queries/%s.sql: %v", dialect, err))
	}
	return q
}

// The column lists scanMessage reads, in its order. PostgreSQL's claim joins
// another relation, so its columns are qualified.
const (
	postgresColumns = `o.id, o.topic, o.payload, o.idempotency_key, o.state, o.attempts,
    o.available_at, o.claimed_until, o.last_error, o.created_at, o.updated_at`
	sqliteColumns = `id, topic, payload, idempotency_key, state, attempts,
    available_at, claimed_until, last_error, created_at, updated_at`
)

// sqliteQueries are the SQLite statements; postgresQueries returns the
// PostgreSQL ones for a schema. Both files are checked at start-up.
var (
	sqliteQueries         = mustParseQueries("sqlite", sqliteSQL, sqliteColumns)
	searchPathPostgresSQL = mustParseQueries("postgres", withSchema(postgresSQL, ""), postgresColumns)
)

// postgresQueries returns the PostgreSQL statements on the tables of schema
// (a quoted identifier), or of the search_path when schema is empty.
func postgresQueries(schema string) *queries {
	if schema == "" {
		return searchPathPostgresSQL
	}
	return mustParseQueries("postgres", withSchema(postgresSQL, schema), postgresColumns)
}

// withSchema fills the {{schema}} placeholder of PostgreSQL SQL: the quoted
// schema name and a dot, or nothing.
func withSchema(sql, schema string) string {
	prefix := ""
	if schema != "" {
		prefix = schema + "."
	}
	return strings.ReplaceAll(sql, "{{schema}}", prefix)
}
