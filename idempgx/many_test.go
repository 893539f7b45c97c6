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

// newGroupStore returns a migrated store with Config.GroupCommit in a
// schema of its own (its key table in partitions when partitions > 0),
// whose grouper has one flight, so that concurrent calls queue and go in
// groups.
func newGroupStore(t *testing.T, partitions int) *Store {
	t.Helper()
	p := testPool(t)
	schema := newSchemaName()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	s := New(p, &Config{Schema: schema, GroupCommit: true, Partitions: partitions})
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	s.group.flights = 1
	return s
}

// TestManyReserveConcurrent reserves keys from hundreds of goroutines at
// once, several per key, so that groups hold merged reservations that
// conflict with each other and with committed records: every key has
// exactly one reservation, every other call gets the record, with its own
// identity, and replays in merged groups find their own records.
func TestManyReserveConcurrent(t *testing.T) {
	t.Parallel()
	for _, partitions := range []int{0, 4} {
		t.Run(fmt.Sprint("partitions=", partitions), func(t *testing.T) {
			t.Parallel()
			s := newGroupStore(t, partitions)
			ctx := t.Context()
			resp := sampleResponse()
			const keys, perKey = 100, 4
			id := func(k int) idemstore.Identity {
				return idemstore.Identity{Scope: fmt.Sprint("tenant-", k%3), Endpoint: "POST /v1/payments", Key: fmt.Sprint("k", k)}
			}
			var mu sync.Mutex
			winners := make(map[int]string)
			var wg sync.WaitGroup
			for i := range keys * perKey {
				wg.Go(func() {
					k := i % keys
					tok := fmt.Sprint("t", i)
					res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id(k), Fingerprint: fp1, Token: tok, Lease: lease, TTL: ttl})
					if err != nil {
						t.Errorf("KeyReserve %d: %v", i, err)
						return
					}
					if res.Record.Identity != id(k) {
						t.Errorf("KeyReserve %d of %v got the record of %v", i, id(k), res.Record.Identity)
						return
					}
					if !res.Reserved {
						if res.Record.Token == tok {
							t.Errorf("KeyReserve %d: not reserved, with its own token", i)
						}
						return
					}
					mu.Lock()
					if w, ok := winners[k]; ok {
						t.Errorf("key %d reserved twice: %s and %s", k, w, tok)
					}
					winners[k] = tok
					mu.Unlock()
					if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id(k), Token: tok, Response: resp}); err != nil {
						t.Errorf("KeyComplete %d: %v", i, err)
					}
				})
			}
			wg.Wait()
			if len(winners) != keys {
				t.Errorf("%d keys reserved, want %d", len(winners), keys)
			}
			if s.group.merged.Load() == 0 {
				t.Fatal("no reservations were merged")
			}
			merged := s.group.merged.Load()
			for i := range keys * 2 {
				wg.Go(func() {
					k := i % keys
					res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id(k), Fingerprint: fp1, Token: fmt.Sprint("again-", i), Lease: lease, TTL: ttl})
					switch {
					case err != nil:
						t.Errorf("replay %d: %v", i, err)
					case res.Reserved || res.Record.State != idemstore.StateCompleted:
						t.Errorf("replay %d: reserved %v, state %s", i, res.Reserved, res.Record.State)
					case res.Record.Identity != id(k) || res.Record.Token != winners[k]:
						t.Errorf("replay %d of %v: the record of %v, token %s (want %s)", i, id(k), res.Record.Identity, res.Record.Token, winners[k])
					case res.Record.Response == nil || res.Record.Response.Status != resp.Status:
						t.Errorf("replay %d: response %+v", i, res.Record.Response)
					}
				})
			}
			wg.Wait()
			if s.group.merged.Load() == merged {
				t.Error("no replays were merged")
			}
		})
	}
}

// TestManyReserveRefusedRunsAlone checks that when the server refuses a
// merged reservation (one call's TTL breaks the table's check), the whole
// group rolls back and every call runs alone: the others reserve, the
// refused one gets the server's error.
func TestManyReserveRefusedRunsAlone(t *testing.T) {
	t.Parallel()
	s := newGroupStore(t, 0)
	const n = 6
	var calls []func(context.Context) error
	for i := range n {
		calls = append(calls, func(ctx context.Context) error {
			p := &idemstore.ReserveParams{Identity: idemstore.Identity{Endpoint: "e", Key: fmt.Sprint("k", i)},
				Fingerprint: fp1, Token: fmt.Sprint("t", i), Lease: lease, TTL: ttl}
			if i == 3 {
				p.TTL = -time.Hour
			}
			res, err := s.KeyReserve(ctx, p)
			if err == nil && !res.Reserved {
				return errors.New("not reserved")
			}
			return err
		})
	}
	errs := groupOf(t, s.group, calls)
	if s.group.merged.Load() == 0 {
		t.Fatal("no reservations were merged")
	}
	for i, err := range errs {
		var pgErr *pgconn.PgError
		switch {
		case i == 3 && !(errors.As(err, &pgErr) && pgErr.Code == "23514"):
			t.Errorf("call %d: %v, want a check violation", i, err)
		case i != 3 && err != nil:
			t.Errorf("call %d: %v", i, err)
		}
	}
}

// TestManyMerge checks which calls of a group are merged: two or more
// reservations, in the place of the first, and not one whose token another
// has.
func TestManyMerge(t *testing.T) {
	m := &manyStatements{reserve: "r", find: "f", reserveMany: "rm", findMany: "fm"}
	res := func(tok string) *groupCall {
		return &groupCall{sql: "r", find: "f", args: []any{"", "", "", tok, "", nil, nil, nil, "", nil}}
	}
	other := &groupCall{sql: "x"}
	a, b, c, d := res("a"), res("b"), res("a"), res("d")
	out := m.merge([]*groupCall{other, a, b, c, d})
	if len(out) != 3 || out[0] != other || out[1].sql != "rm" || out[2] != c {
		t.Fatalf("merged %v", out)
	}
	if got := out[1].members; len(got) != 3 || got[0] != a || got[1] != b || got[2] != d {
		t.Errorf("members %v", got)
	}
	if out := m.merge([]*groupCall{other, a}); len(out) != 2 || out[1] != a {
		t.Errorf("a single reservation merged: %v", out)
	}
}

// TestManyGroupWithLostLease sends, in one group, merged reservations of
// new keys and the completions of a key whose lease another attempt took
// over: the stale completion loses its lease, the new one completes, and
// the reservations take effect.
func TestManyGroupWithLostLease(t *testing.T) {
	t.Parallel()
	s := newGroupStore(t, 0)
	ctx := t.Context()
	taken := idemstore.Identity{Endpoint: "e", Key: "taken"}
	reserve := func(tok string, lease time.Duration) *idemstore.ReserveResult {
		t.Helper()
		res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: taken, Fingerprint: fp1, Token: tok,
			Lease: lease, TTL: ttl, LeaseExpiredState: idemstore.StateReleased})
		if err != nil || !res.Reserved {
			t.Fatalf("KeyReserve %s: %v, %+v", tok, err, res)
		}
		return res
	}
	reserve("old", time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	reserve("new", lease) // the expired lease is taken over
	var calls []func(context.Context) error
	for _, tok := range []string{"old", "new"} {
		calls = append(calls, func(ctx context.Context) error {
			return s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: taken, Token: tok, Response: sampleResponse()})
		})
	}
	for i := range 4 {
		calls = append(calls, func(ctx context.Context) error {
			res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: idemstore.Identity{Endpoint: "e", Key: fmt.Sprint("k", i)},
				Fingerprint: fp1, Token: fmt.Sprint("t", i), Lease: lease, TTL: ttl})
			if err == nil && !res.Reserved {
				return errors.New("not reserved")
			}
			return err
		})
	}
	errs := groupOf(t, s.group, calls)
	if s.group.merged.Load() == 0 {
		t.Fatal("no reservations were merged")
	}
	if !errors.Is(errs[0], idemstore.ErrLeaseLost) {
		t.Errorf("stale completion: %v, want ErrLeaseLost", errs[0])
	}
	for i, err := range errs[1:] {
		if err != nil {
			t.Errorf("call %d: %v", i+1, err)
		}
	}
	rec, err := s.KeyGet(ctx, taken)
	if err != nil || rec.State != idemstore.StateCompleted || rec.Token != "new" {
		t.Errorf("KeyGet: %v, %+v", err, rec)
	}
}
