package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
)

// Prepared statements.
//
// SQLite compiles a statement's text on every call that sends it, and for
// the store's statements (the insert checks every constraint of the table)
// compiling costs more CPU than running them. Open therefore prepares the
// statements of the request path once, on the write pool and on the read
// pool; the store's write transactions use the write pool's through
// Tx.StmtContext, which finds them prepared on the one write connection. A
// store made by New prepares none (its schema may not exist yet) and sends
// the text. Transactions of KeyBeginTx use them too; the caller's own
// (CompleteTx, CheckpointTx) send the text, as they may come from another
// *sql.DB on the same file.

// writeStatements are prepared on the write pool, readStatements on the
// read pool.
var (
	writeStatements = []string{selectKey, insertKey, takeoverKey, expireLease, completeKey, releaseKey,
		markUnknownKey, deleteKey, renewKey, failReconcileKey, resolveKey, purgeKey, checkpointKey}
	readStatements = []string{selectKey}
)

// statements are the prepared statements of one pool, by their text.
type statements map[string]*sql.Stmt

// prepareAll prepares queries on db.
func prepareAll(ctx context.Context, db *sql.DB, queries []string) (statements, error) {
	st := make(statements, len(queries))
	for _, q := range queries {
		p, err := db.PrepareContext(ctx, q)
		if err != nil {
			return nil, errors.Join(err, st.close())
		}
		st[q] = p
	}
	return st, nil
}

// close closes the statements.
func (st statements) close() error {
	var err error
	for _, p := range st {
		err = errors.Join(err, p.Close())
	}
	return err
}

// preparedQuerier runs the statements it has prepared through them, in tx
// when tx is set, and sends the text of the others to q.
type preparedQuerier struct {
	q  querier
	tx *sql.Tx
	st statements
}

// stmt returns the prepared statement of query, or nil.
func (p preparedQuerier) stmt(ctx context.Context, query string) *sql.Stmt {
	st, ok := p.st[query]
	if !ok {
		return nil
	}
	if p.tx != nil {
		return p.tx.StmtContext(ctx, st)
	}
	return st
}

func (p preparedQuerier) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := p.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return p.q.ExecContext(ctx, query, args...)
}

func (p preparedQuerier) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := p.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return p.q.QueryRowContext(ctx, query, args...)
}
