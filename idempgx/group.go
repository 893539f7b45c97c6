package idempgx

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/deadline"
)

// maxGroup bounds the calls of one group.
const maxGroup = 16

// grouper sends the hot statements of concurrent calls (reserve, complete)
// together (Config.GroupCommit): a group is one write to one connection and
// one implicit transaction, so its statements share one commit, one WAL
// flush and one wake-up of the backend, on both sides.
//
// At most flights groups are in flight at once, a quarter of the pool's
// connections (at least one): fewer flights make larger groups, and more
// connections stay free for the store's other statements. A call that finds a flight
// free leads at once: it sends itself and whatever calls are queued, so a
// quiet store sends every statement alone, as without grouping. A call that
// finds every flight busy queues; a leader that is done hands its flight to
// the first queued call, which leads the queue.
//
// A group commits or rolls back as a whole. When the server refuses one of
// its statements (a *pgconn.PgError: the transaction rolled back, nothing of
// it was written), every call of the group runs its statement again alone.
// Any other error (the connection failed) is every call's: as with a
// statement sent alone, its outcome is unknown. Statements are sent in the
// order of their identities, the only rows they lock, so that two groups
// never wait for each other's locks in opposite orders.
//
// A group's reservations, when two or more, go as one statement over
// arrays in the place of the first (many.go): its rows are written in the
// order of their identities too, before any other call's that falls
// between them. (A deadlock, should one come of it, is the server's
// refusal: the group runs call by call.)
type grouper struct {
	pool    *pgxpool.Pool
	sender  *sender
	flights int
	many    *manyStatements // nil: no call is merged

	mu     sync.Mutex
	active int // flights in use
	queue  []*groupCall

	grouped atomic.Int64 // statements sent in groups of two or more
	merged  atomic.Int64 // calls sent merged (see many.go)
}

// groupCall is one statement of a group: it returns one row, scanned into
// dest. A reservation (find set) is two: sql, an insert that returns no
// row, then find (with the first reserveFindArgs of args), whose row is
// scanned into found only when the insert wrote nothing.
type groupCall struct {
	id   idemstore.Identity
	sql  string
	args []any
	dest []any
	// find, found and inserted: a reservation's.
	find     string
	found    *recordScan
	inserted bool
	err      error
	// members: a merged call's calls (see many.go).
	members []*groupCall
	// deadline is the caller's context's, if it has one.
	deadline    time.Time
	hasDeadline bool
	// wake receives true when err and dest are set, false when the call
	// is handed a flight to lead.
	wake chan bool
}

// queue adds c's statements to b, with plain arguments (see plainArgs).
func (c *groupCall) queue(b *pgx.Batch) {
	args := plainArgs(c.args)
	b.Queue(c.sql, args...)
	if c.find != "" {
		b.Queue(c.find, args[:reserveFindArgs]...)
	}
}

// plainArgs returns a copy of args in which the pointers the store passes
// to spare an allocation per argument (to a string, a time, a duration)
// are replaced by what they point to: what a tracer shows and pgx's own
// statements take, as before the pointers. A nil pointer stays (NULL).
func plainArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case *string:
			if v != nil {
				a = *v
			}
		case *time.Time:
			if v != nil {
				a = *v
			}
		case *time.Duration:
			if v != nil {
				a = *v
			}
		}
		out[i] = a
	}
	return out
}

// alone runs c's statements by themselves on pool.
func (c *groupCall) alone(ctx context.Context, sn *sender) error {
	sn.exec(ctx, []*groupCall{c})
	return c.err
}

// newGrouper returns a grouper that sends its groups with sn, on sn's pool.
func newGrouper(sn *sender) *grouper {
	return &grouper{pool: sn.pool, sender: sn, flights: max(1, int(sn.pool.Config().MaxConns)/4)}
}

// queryRow runs sql, which returns one row, with args, and scans the row
// into dest, in a group with concurrent calls. It returns pgx.ErrNoRows when
// the statement returned no row.
func (g *grouper) queryRow(ctx context.Context, id idemstore.Identity, sql string, dest []any, args ...any) error {
	return g.run(ctx, &groupCall{id: id, sql: sql, args: args, dest: dest})
}

// run runs c in a group with concurrent calls.
func (g *grouper) run(ctx context.Context, c *groupCall) error {
	c.wake = make(chan bool, 1)
	c.deadline, c.hasDeadline = ctx.Deadline()
	g.mu.Lock()
	if g.active < g.flights {
		g.active++
		g.mu.Unlock()
		return g.lead(ctx, c)
	}
	g.queue = append(g.queue, c)
	g.mu.Unlock()
	select {
	case done := <-c.wake:
		if !done {
			return g.lead(ctx, c)
		}
		if errors.Is(c.err, errGroupRolledBack) {
			return g.alone(ctx, c)
		}
		return c.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	if i := slices.Index(g.queue, c); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	// Taken by a leader, or handed a flight: the flight must go on.
	if done := <-c.wake; !done {
		g.handOff()
	}
	return ctx.Err()
}

// errGroupRolledBack marks the calls of a group the server refused.
var errGroupRolledBack = errors.New("idempgx: statement group rolled back")

// lead sends c and the queued calls (up to maxGroup), delivers their
// results, and hands the flight on.
func (g *grouper) lead(ctx context.Context, c *groupCall) error {
	group := []*groupCall{c}
	g.mu.Lock()
	n := min(len(g.queue), maxGroup-1)
	group = append(group, g.queue[:n]...)
	g.queue = slices.Delete(g.queue, 0, n)
	g.mu.Unlock()
	g.send(ctx, group)
	for _, o := range group {
		if o != c {
			o.wake <- true
		}
	}
	g.handOff()
	if errors.Is(c.err, errGroupRolledBack) {
		return g.alone(ctx, c)
	}
	return c.err
}

// handOff gives the caller's flight to the first queued call, or frees it.
func (g *grouper) handOff() {
	g.mu.Lock()
	if len(g.queue) == 0 {
		g.active--
		g.mu.Unlock()
		return
	}
	next := g.queue[0]
	g.queue = slices.Delete(g.queue, 0, 1)
	g.mu.Unlock()
	next.wake <- false
}

// alone runs c's statements by themselves.
func (g *grouper) alone(ctx context.Context, c *groupCall) error {
	return c.alone(ctx, g.sender)
}

// send runs group and sets every call's err. A group of one is a plain
// statement on ctx; a larger one runs on a context that ends at the latest
// deadline of its calls (leader's ctx values, none of its cancellation: the
// other calls wait for it), an alarm of the process's shared list rather
// than a runtime timer and a cancellation context of its own (see
// internal/deadline).
func (g *grouper) send(ctx context.Context, group []*groupCall) {
	if len(group) == 1 {
		c := group[0]
		c.err = g.alone(ctx, c)
		return
	}
	var latest time.Time
	for _, c := range group {
		if !c.hasDeadline {
			latest = time.Time{}
			break
		}
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	var gctx context.Context
	if latest.IsZero() {
		gctx = context.WithoutCancel(ctx)
	} else {
		var release func()
		gctx, release = deadline.WithTimeout(deadline.Wall, ctx, time.Until(latest))
		defer release()
	}
	slices.SortFunc(group, func(a, b *groupCall) int {
		return cmp.Or(strings.Compare(a.id.Scope, b.id.Scope),
			strings.Compare(a.id.Endpoint, b.id.Endpoint), strings.Compare(a.id.Key, b.id.Key))
	})
	g.grouped.Add(int64(len(group)))
	calls := group
	if g.many != nil && g.sender.prepare {
		calls = g.many.merge(group)
		if len(calls) < len(group) {
			g.merged.Add(int64(len(group) - len(calls) + 1))
		}
	}
	err := g.sender.exec(gctx, calls)
	if isPgError(err) {
		for _, c := range group {
			c.err = errGroupRolledBack
		}
		return
	}
	for _, mc := range calls {
		if mc.members != nil && mc.err != nil {
			for _, c := range mc.members {
				c.err = mc.err
			}
		}
	}
}

// isPgError reports whether err is an error the server reported.
func isPgError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}
