package idempgx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-dev/idem/idemstore"
)

// groupOf sends calls in one group on g (one flight): the first call holds
// the flight until every other call has queued.
func groupOf(t *testing.T, g *grouper, calls []func(context.Context) error) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	// The blocker takes the flight and waits until the others queued.
	blocked := make(chan struct{})
	wg.Go(func() {
		var one int
		err := g.queryRow(ctx, idemstore.Identity{}, `SELECT 1 FROM pg_sleep(0.3)`, []any{&one})
		if err != nil {
			t.Errorf("blocker: %v", err)
		}
	})
	go func() {
		for {
			g.mu.Lock()
			n := g.active
			g.mu.Unlock()
			if n == 1 {
				close(blocked)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	<-blocked
	for i, call := range calls {
		wg.Go(func() { errs[i] = call(ctx) })
	}
	wg.Wait()
	if g.grouped.Load() == 0 {
		t.Error("no statements were grouped")
	}
	return errs
}

// TestGroupCommitRolledBackGroupRunsAlone checks that when the server
// refuses one statement of a group, which rolls the whole group back, the
// others run again alone and take effect, and the refused one returns the
// server's error.
func TestGroupCommitRolledBackGroupRunsAlone(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx := t.Context()
	table := s.schema + ".group_test"
	if _, err := s.pool.Exec(ctx, "CREATE TABLE "+table+" (n integer PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	g := newGrouper(s.send)
	g.flights = 1
	const n = 6
	var calls []func(context.Context) error
	for i := range n {
		calls = append(calls, func(ctx context.Context) error {
			var got int
			id := idemstore.Identity{Key: fmt.Sprint(i)}
			if i == 3 { // division by zero: the server refuses it
				return g.queryRow(ctx, id, "SELECT 1 / $1::integer", []any{&got}, 0)
			}
			return g.queryRow(ctx, id, "INSERT INTO "+table+" VALUES ($1) RETURNING n", []any{&got}, i)
		})
	}
	errs := groupOf(t, g, calls)
	for i, err := range errs {
		var pgErr *pgconn.PgError
		switch {
		case i == 3 && !(errors.As(err, &pgErr) && pgErr.Code == "22012"):
			t.Errorf("call %d: %v, want division by zero", i, err)
		case i != 3 && err != nil:
			t.Errorf("call %d: %v", i, err)
		}
	}
	var rows int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != n-1 {
		t.Errorf("%d rows inserted, want %d", rows, n-1)
	}
}

// TestGroupCommitNoRows checks that a statement of a group that returns no
// row gets pgx.ErrNoRows without failing its group.
func TestGroupCommitNoRows(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	g := newGrouper(s.send)
	g.flights = 1
	var calls []func(context.Context) error
	for i := range 4 {
		calls = append(calls, func(ctx context.Context) error {
			var got int
			return g.queryRow(ctx, idemstore.Identity{Key: fmt.Sprint(i)},
				"SELECT $1::integer WHERE $1::integer % 2 = 0", []any{&got}, i)
		})
	}
	for i, err := range groupOf(t, g, calls) {
		if want := i%2 == 0; want != (err == nil) || (err != nil && !errors.Is(err, pgx.ErrNoRows)) {
			t.Errorf("call %d: %v", i, err)
		}
	}
}

// TestGroupCommitReserveComplete reserves and completes many keys at once
// through grouped statements, and replays them.
func TestGroupCommitReserveComplete(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	s.group = newGrouper(s.send)
	s.group.flights = 1
	ctx := t.Context()
	resp := sampleResponse()
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			id := idemstore.Identity{Scope: "s", Endpoint: "POST /v1/payments", Key: fmt.Sprint("k", i%20)}
			tok := fmt.Sprint("t", i)
			res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: fp1, Token: tok, Lease: lease, TTL: ttl})
			if err != nil {
				t.Errorf("KeyReserve %d: %v", i, err)
				return
			}
			if !res.Reserved {
				return // the other request of the key has it
			}
			if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: tok, Response: resp}); err != nil {
				t.Errorf("KeyComplete %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if s.group.grouped.Load() == 0 {
		t.Error("no statements were grouped")
	}
	for i := range 20 {
		id := idemstore.Identity{Scope: "s", Endpoint: "POST /v1/payments", Key: fmt.Sprint("k", i)}
		res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: fp1, Token: "again", Lease: lease, TTL: ttl})
		if err != nil || res.Reserved || res.Record.State != idemstore.StateCompleted {
			t.Errorf("replay of %s: %v, %+v", id.Key, err, res)
		}
	}
}

// TestGroupCommitCanceledWhileQueued checks that a call whose context ends
// while it waits for a flight returns at once with the context's error, and
// that the flight goes on for the others.
func TestGroupCommitCanceledWhileQueued(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	g := newGrouper(s.send)
	g.flights = 1
	ctx := t.Context()
	var wg sync.WaitGroup
	wg.Go(func() {
		var one int
		if err := g.queryRow(ctx, idemstore.Identity{}, `SELECT 1 FROM pg_sleep(0.5)`, []any{&one}); err != nil {
			t.Errorf("blocker: %v", err)
		}
	})
	for {
		g.mu.Lock()
		n := g.active
		g.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	var got int
	start := time.Now()
	err := g.queryRow(short, idemstore.Identity{Key: "a"}, "SELECT 1", []any{&got})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 400*time.Millisecond {
		t.Errorf("queued call with an ended context: %v after %v, want its deadline at once", err, time.Since(start))
	}
	if err := g.queryRow(ctx, idemstore.Identity{Key: "b"}, "SELECT 2", []any{&got}); err != nil || got != 2 {
		t.Errorf("call after the canceled one: %d, %v", got, err)
	}
	wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active != 0 || len(g.queue) != 0 {
		t.Errorf("after every call: %d flights in use, %d calls queued; want none", g.active, len(g.queue))
	}
}

// TestGroupCommitGroupEndsAtLatestDeadline checks that a group whose
// statements outlast every call's deadline ends at the latest of them: not
// at the leader's, not never.
func TestGroupCommitGroupEndsAtLatestDeadline(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	g := newGrouper(s.send)
	g.flights = 1
	start := time.Now()
	deadlines := []time.Duration{700 * time.Millisecond, 1200 * time.Millisecond}
	errs := groupOf(t, g, []func(context.Context) error{
		func(ctx context.Context) error {
			ctx, cancel := context.WithDeadline(ctx, start.Add(deadlines[0]))
			defer cancel()
			var one int
			return g.queryRow(ctx, idemstore.Identity{Key: "a"}, `SELECT 1 FROM pg_sleep(10)`, []any{&one})
		},
		func(ctx context.Context) error {
			ctx, cancel := context.WithDeadline(ctx, start.Add(deadlines[1]))
			defer cancel()
			var one int
			return g.queryRow(ctx, idemstore.Identity{Key: "b"}, `SELECT 1 FROM pg_sleep(10)`, []any{&one})
		},
	})
	took := time.Since(start)
	for i, err := range errs {
		if err == nil {
			t.Errorf("call %d: no error, want its group's timeout", i)
		}
	}
	if took < deadlines[1] || took > deadlines[1]+3*time.Second {
		t.Errorf("the group ended after %v, want soon after the latest deadline, %v", took, deadlines[1])
	}
}
