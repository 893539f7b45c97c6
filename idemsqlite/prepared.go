package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
)

// Prepared statements.
//
// SQLite compiles a statement's text on every call that sends it, and for
// the store's statements (the insert checks every constraint of the table)
// compiling costs more CPU than running them. Open therefore prepares the
// statements of the request path once, on the write pool and on the read
// pool; the store's write transactions use the write pool's through
// Tx.StmtContext, which finds them prepared on the one write connection
// (once per statement and transaction: a batch's writes share them). They
// are prepared with anonymous parameters (see positional). A store made by
// New prepares none (its schema may not exist yet) and sends the text.
// Transactions of KeyBeginTx use them too; the caller's own (CompleteTx,
// CheckpointTx) send the text, as they may come from another *sql.DB on the
// same file.

// writeStatements are prepared on the write pool, readStatements on the
// read pool.
var (
	writeStatements = []string{selectKey, insertKey, takeoverKey, expireLease, completeKey, releaseKey,
		markUnknownKey, deleteKey, renewKey, failReconcileKey, resolveKey, purgeKey, checkpointKey}
	readStatements = []string{selectKey}
)

// statements are the prepared statements of one pool, by their text.
type statements map[string]*prepared

// prepared is one prepared statement: its text with anonymous parameters
// (see positional) and, for each of them, the argument it takes.
type prepared struct {
	stmt *sql.Stmt
	args []int
}

// prepareAll prepares queries on db.
func prepareAll(ctx context.Context, db *sql.DB, queries []string) (statements, error) {
	st := make(statements, len(queries))
	for _, q := range queries {
		text, args := positional(q)
		p, err := db.PrepareContext(ctx, text)
		if err != nil {
			return nil, errors.Join(err, st.close())
		}
		st[q] = &prepared{stmt: p, args: args}
	}
	return st, nil
}

// positional returns query with its numbered parameters (?1, ?2, ...) made
// anonymous (?), and for each of them, in order, the index of the argument
// it takes. The driver binds a numbered parameter by looking its name up
// among the arguments, which costs more than the statement's own work for
// a statement of ten parameters; an anonymous one it binds by position.
// The store's SQL has no question mark in a literal.
func positional(query string) (string, []int) {
	var (
		b    strings.Builder
		args []int
	)
	for {
		i := strings.IndexByte(query, '?')
		if i < 0 {
			b.WriteString(query)
			return b.String(), args
		}
		j := i + 1
		for j < len(query) && '0' <= query[j] && query[j] <= '9' {
			j++
		}
		n, err := strconv.Atoi(query[i+1 : j])
		if err != nil {
			panic("idemsqlite: a parameter without a number in " + query)
		}
		b.WriteString(query[:i+1])
		args = append(args, n-1)
		query = query[j:]
	}
}

// bind returns the arguments of p's anonymous parameters, taken from args
// of the numbered ones.
func (p *prepared) bind(args []any) []any {
	out := make([]any, len(p.args))
	for i, a := range p.args {
		out[i] = args[a]
	}
	return out
}

// close closes the statements.
func (st statements) close() error {
	var err error
	for _, p := range st {
		err = errors.Join(err, p.stmt.Close())
	}
	return err
}

// preparedQuerier runs the statements it has prepared through them, in tx
// when tx is set, and sends the text of the others to q. txst, when set,
// keeps the statements made for tx, so that the writes of a batch make each
// once.
type preparedQuerier struct {
	q    querier
	tx   *sql.Tx
	st   statements
	txst map[*sql.Stmt]*sql.Stmt
}

// stmt returns the prepared statement of query and its arguments, or nil.
func (p preparedQuerier) stmt(ctx context.Context, query string, args []any) (*sql.Stmt, []any) {
	st, ok := p.st[query]
	if !ok {
		return nil, nil
	}
	if p.tx != nil {
		ts, ok := p.txst[st.stmt]
		if !ok {
			ts = p.tx.StmtContext(ctx, st.stmt)
			if p.txst != nil {
				p.txst[st.stmt] = ts
			}
		}
		return ts, st.bind(args)
	}
	return st.stmt, st.bind(args)
}

func (p preparedQuerier) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st, args := p.stmt(ctx, query, args); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return p.q.ExecContext(ctx, query, args...)
}

func (p preparedQuerier) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st, args := p.stmt(ctx, query, args); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return p.q.QueryRowContext(ctx, query, args...)
}
