package idempgx

import (
	"embed"
	"fmt"
	"strings"

	"github.com/idem-dev/idem/internal/sqlfile"
)

//go:embed queries.sql
var queriesSQL string

//go:embed migrations/*.sql
var migrationsFS embed.FS

// columns is the record's column list, in the order scanRecord reads it.
const columns = `k.scope, k.endpoint, k.key, k.fingerprint, k.state, k.token,
    k.locked_until, k.started_at, k.lease_expired_state, k.response_status,
    k.response_header, k.response_body, k.not_replayable, k.recovery_point,
    k.attempts, k.created_at, k.updated_at, k.expires_at, k.ttl,
    k.reconcile_after, k.reconcile_attempts, k.reconcile_error`

// notifyPayloadSQL is the hash of the identity of a row u, as notifyPayload
// computes it.
// One call of format, not a chain of || and casts: PostgreSQL sets up
// every node of a statement's expressions on every execution, even those
// it does not evaluate (complete's notification, which only a record with
// waiters sends); the chain cost some 6,000 more instructions per
// completion.
const notifyPayloadSQL = `md5(format('%s:%s%s:%s%s', octet_length(u.scope), u.scope,
    octet_length(u.endpoint), u.endpoint, u.key))`

// queries are the store's statements with the placeholders filled in.
type queries struct {
	reserve, find, reclaim, get, complete, release, markUnknown, delete, renew,
	checkpoint, resolve, sweep, reap, list, wait string
	purgeLock, purge, reconcileClaim, reconcileFail, backlog string
	// reserveMany and findMany: reserve and find for several calls of a
	// group in one statement each.
	reserveMany, findMany string
}

// expand fills the placeholders of queries.sql and of the migrations: the
// quoted schema name and the notification channel (a plain identifier).
func expand(sql, schema, channel string) string {
	return strings.NewReplacer(
		"{{schema}}", schema,
		"{{columns}}", columns,
		"{{channel}}", "'"+channel+"'",
		"{{notify_payload}}", notifyPayloadSQL,
		"{{notify_payload_k}}", strings.ReplaceAll(notifyPayloadSQL, "u.", "k."),
	).Replace(sql)
}

// statements are the statements of queries.sql, before expand.
var statements = sqlfile.MustParse("idempgx/queries.sql", queriesSQL)

// loadQueries returns the statements for the quoted schema name and the
// notification channel.
func loadQueries(schema, channel string) *queries {
	q := func(name string) string {
		sql, ok := statements[name]
		if !ok {
			panic(fmt.Sprintf("idempgx: no statement %q in queries.sql", name))
		}
		return expand(sql, schema, channel)
	}
	return &queries{
		reserve:     q("reserve"),
		find:        q("find"),
		reclaim:     q("reclaim"),
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

		purgeLock:      q("purge_lock"),
		purge:          q("purge"),
		reconcileClaim: q("reconcile_claim"),
		reconcileFail:  q("reconcile_fail"),
		backlog:        q("backlog"),

		reserveMany: q("reserve_many"),
		findMany:    q("find_many"),
	}
}
