package idempgx

import (
	"embed"
	"fmt"
	"maps"
	"strings"
)

//go:embed queries.sql
var queriesSQL string

//go:embed migrate.sql
var migrateSQL string

//go:embed migrations/*.sql
var migrationsFS embed.FS

// columns is the record's column list, in the order scanRecord reads it.
const columns = `k.scope, k.endpoint, k.key, k.fingerprint, k.state, k.token,
    k.locked_until, k.started_at, k.lease_expired_state, k.response_status,
    k.response_header, k.response_body, k.not_replayable, k.recovery_point,
    k.attempts, k.created_at, k.updated_at, k.expires_at`

// notifyPayloadSQL is the hash of the identity of a row u, as notifyPayload
// computes it.
const notifyPayloadSQL = `md5(octet_length(u.scope)::text || ':' || u.scope
    || octet_length(u.endpoint)::text || ':' || u.endpoint || u.key)`

// queries are the store's statements with the placeholders filled in.
type queries struct {
	reserve, get, complete, release, markUnknown, delete, renew,
	checkpoint, resolve, sweep, reap, list, wait string

	migrateLock, schemaExists, createSchema, createMigrationsTable,
	migrationsTableExists, appliedMigrations, recordMigration,
	unrecordMigration string
}

// expand fills the placeholders of queries.sql and of the migrations: the
// quoted schema name and the notification channel (a plain identifier).
func expand(sql, schema, channel string) string {
	return strings.NewReplacer(
		"{{schema}}", schema,
		"{{columns}}", columns,
		"{{channel}}", "'"+channel+"'",
		"{{notify_payload}}", notifyPayloadSQL,
	).Replace(sql)
}

// parseQueries splits queries.sql at its "-- name: X" lines.
func parseQueries(src string) map[string]string {
	out := make(map[string]string)
	var name string
	var b strings.Builder
	flush := func() {
		if name != "" {
			out[name] = strings.TrimSpace(b.String())
		}
		b.Reset()
	}
	for line := range strings.Lines(src) {
		if n, ok := strings.CutPrefix(line, "-- name: "); ok {
			flush()
			name = strings.TrimSpace(n)
			continue
		}
		if name != "" {
			b.WriteString(line)
		}
	}
	flush()
	return out
}

// loadQueries returns the statements for the quoted schema name and the
// notification channel.
func loadQueries(schema, channel string) *queries {
	m := parseQueries(queriesSQL)
	maps.Copy(m, parseQueries(migrateSQL))
	q := func(name string) string {
		sql, ok := m[name]
		if !ok {
			panic(fmt.Sprintf("idempgx: no statement %q in queries.sql or migrate.sql", name))
		}
		return expand(sql, schema, channel)
	}
	return &queries{
		reserve:     q("reserve"),
		get:         q("get"),
		complete:    q("complete"),
		release:     q("release"),
		markUnknown: q("mark_unknown"),
		delete:      q("delete"),
		renew:       q("renew"),
		checkpoint:  q("checkpoint"),
		resolve:     q("resolve"),
		sweep:       q("sweep"),
		reap:        q("reap"),
		list:        q("list"),
		wait:        q("wait"),

		migrateLock:           q("migrate_lock"),
		schemaExists:          q("schema_exists"),
		createSchema:          q("create_schema"),
		createMigrationsTable: q("create_migrations_table"),
		migrationsTableExists: q("migrations_table_exists"),
		appliedMigrations:     q("applied_migrations"),
		recordMigration:       q("record_migration"),
		unrecordMigration:     q("unrecord_migration"),
	}
}
