package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// holdWriter makes s's writer busy: a transaction holds its one write
// connection, so the store's writes queue behind it. wait(n) returns once n
// writes have queued (the first of them leads the next batch and waits to
// begin its transaction); release ends the transaction and lets them go.
func holdWriter(t *testing.T, s *idemsqlite.Store) (wait func(n int), release func()) {
	t.Helper()
	joined := make(chan int, 1024)
	idemsqlite.OnQueued(s, func(n int) { joined <- n })
	tx, err := s.DB().BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := tx.Rollback(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	seen := 0
	wait = func(n int) {
		for seen < n {
			seen = max(seen, <-joined)
		}
	}
	return wait, release
}

func reserveParams(key, token string) *idemstore.ReserveParams {
	return &idemstore.ReserveParams{
		Identity:    idemstore.Identity{Scope: "tenant", Endpoint: "POST /v1/payments", Key: key},
		Fingerprint: "fp", Token: token, Lease: time.Minute, TTL: time.Hour,
	}
}

func created(body string) *idemstore.Response {
	return &idemstore.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte(body)}
}

// TestGroupCommitReservesOnce: 400 goroutines reserve 100 new keys, four
// attempts per key, all queued behind a busy writer: they commit in
// ceil(400/MaxBatch) transactions, and each key is reserved exactly once,
// by the attempt whose token the record holds. Their completions then
// commit in shared transactions too.
func TestGroupCommitReservesOnce(t *testing.T) {
	t.Parallel()
	const keys, attempts, maxBatch = 100, 4, 64
	s := openStore(t, &idemsqlite.Config{MaxBatch: maxBatch})
	wait, release := holdWriter(t, s)
	ctx := t.Context()

	type result struct {
		key, token string
		res        *idemstore.ReserveResult
		err        error
	}
	results := make(chan result, keys*attempts)
	var wg sync.WaitGroup
	for i := range keys * attempts {
		key, token := fmt.Sprint("key-", i%keys), fmt.Sprint("token-", i)
		wg.Go(func() {
			res, err := s.KeyReserve(ctx, reserveParams(key, token))
			results <- result{key, token, res, err}
		})
	}
	wait(keys * attempts)
	commits0, writes0 := idemsqlite.BatchStats(s)
	release()
	wg.Wait()
	close(results)

	winners := map[string]string{}
	for r := range results {
		if r.err != nil {
			t.Fatalf("KeyReserve(%s, %s): %v", r.key, r.token, r.err)
		}
		if !r.res.Reserved {
			continue
		}
		if w, ok := winners[r.key]; ok {
			t.Fatalf("%s reserved twice: by %s and %s", r.key, w, r.token)
		}
		winners[r.key] = r.token
	}
	if len(winners) != keys {
		t.Fatalf("%d keys reserved, want %d", len(winners), keys)
	}
	commits, writes := idemsqlite.BatchStats(s)
	wantCommits := int64((keys*attempts + maxBatch - 1) / maxBatch)
	if commits-commits0 != wantCommits || writes-writes0 != keys*attempts {
		t.Fatalf("%d writes in %d commits; want %d writes in %d commits",
			writes-writes0, commits-commits0, keys*attempts, wantCommits)
	}
	t.Logf("%d reservations in %d commits", writes-writes0, commits-commits0)

	for key, token := range winners {
		r, err := s.KeyGet(ctx, reserveParams(key, token).Identity)
		if err != nil || r.State != idemstore.StateInProgress || r.Token != token {
			t.Fatalf("%s after the race: %+v, %v; want in_progress under %s", key, r, err, token)
		}
	}

	// The completions, all at once, without a held writer.
	commits0, writes0 = idemsqlite.BatchStats(s)
	errs := make(chan error, keys)
	for key, token := range winners {
		wg.Go(func() {
			errs <- s.KeyComplete(ctx, &idemstore.CompleteParams{
				Identity: reserveParams(key, token).Identity, Token: token, Response: created(key),
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("KeyComplete: %v", err)
		}
	}
	commits, writes = idemsqlite.BatchStats(s)
	t.Logf("%d completions in %d commits", writes-writes0, commits-commits0)
	if writes-writes0 != keys || commits-commits0 > keys {
		t.Fatalf("%d completions in %d commits; want %d in at most as many", writes-writes0, commits-commits0, keys)
	}
	recs, err := s.KeyList(ctx, &idemstore.ListParams{State: idemstore.StateCompleted, Limit: 2 * keys})
	if err != nil || len(recs) != keys {
		t.Fatalf("KeyList(completed) = %d records, %v; want %d", len(recs), err, keys)
	}
	for _, r := range recs {
		if r.Response == nil || string(r.Response.Body) != r.Key || r.Token != winners[r.Key] {
			t.Fatalf("%s completed with %+v under %s; want its own body under %s", r.Key, r.Response, r.Token, winners[r.Key])
		}
	}
}

// TestGroupCommitFailureIsolated: writes that fail inside a batch (a
// constraint violation, a lost fence, a write that fails after writing, a
// write that panics after writing) fail alone: the batch's other writes commit, and the failed ones leave
// nothing behind.
func TestGroupCommitFailureIsolated(t *testing.T) {
	t.Parallel()
	const writes = 7
	s := openStore(t, nil)
	ctx := t.Context()
	id := func(key string) idemstore.Identity { return reserveParams(key, "").Identity }
	for _, key := range []string{"done", "bad-status", "fenced", "released"} {
		reserve(t, s, id(key), "t-"+key)
	}
	if _, err := s.DB().Exec("CREATE TABLE side_effects (x INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	wait, release := holdWriter(t, s)

	errs := make([]error, writes)
	var wg sync.WaitGroup
	ops := []func() error{
		func() error { // a new key
			_, err := s.KeyReserve(ctx, reserveParams("new", "t-new"))
			return err
		},
		func() error { // violates idem_keys_response_status_check
			return s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id("bad-status"), Token: "t-bad-status",
				Response: &idemstore.Response{Status: 1000, Body: []byte("x")}})
		},
		func() error { // another attempt's token
			return s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id("fenced"), Token: "stale", Response: created("stale")})
		},
		func() error { // writes, then fails: its write must be undone
			return idemsqlite.WriteTx(s, ctx, func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, "INSERT INTO side_effects (x) VALUES (1)"); err != nil {
					return err
				}
				return errors.New("failing after a write")
			})
		},
		func() error {
			return s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id("done"), Token: "t-done", Response: created("done")})
		},
		func() error {
			return s.KeyRelease(ctx, &idemstore.FinishParams{Identity: id("released"), Token: "t-released"})
		},
		func() error {
			return idemsqlite.WriteTx(s, ctx, func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, "INSERT INTO side_effects (x) VALUES (2)"); err != nil {
					return err
				}
				panic("a bug")
			})
		},
	}
	// The first write to queue leads and waits for the writer; the others
	// queue behind it and join its batch.
	for i := range writes {
		wg.Go(func() { errs[i] = ops[i]() })
	}
	wait(writes)
	commits0, writes0 := idemsqlite.BatchStats(s)
	release()
	wg.Wait()
	if commits, n := idemsqlite.BatchStats(s); commits-commits0 != 1 || n-writes0 != writes {
		t.Fatalf("%d writes in %d commits, want %d in one", n-writes0, commits-commits0, writes)
	}

	for i, err := range errs {
		switch i {
		case 1:
			if err == nil || errors.Is(err, idemstore.ErrLeaseLost) {
				t.Errorf("completing with status 1000: %v; want a constraint error", err)
			}
		case 2:
			if !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Errorf("completing with a stale token: %v; want ErrLeaseLost", err)
			}
		case 3:
			if err == nil || err.Error() != "failing after a write" {
				t.Errorf("the failing write: %v; want its own error", err)
			}
		case 6:
			if err == nil || !strings.Contains(err.Error(), "panicked: a bug") {
				t.Errorf("the panicking write: %v; want its panic as its error", err)
			}
		default:
			if err != nil {
				t.Errorf("write %d failed with the batch's others: %v", i, err)
			}
		}
	}
	want := map[string]idemstore.State{
		"new": idemstore.StateInProgress, "bad-status": idemstore.StateInProgress, "fenced": idemstore.StateInProgress,
		"done": idemstore.StateCompleted, "released": idemstore.StateReleased,
	}
	for key, state := range want {
		r, err := s.KeyGet(ctx, id(key))
		if err != nil || r.State != state {
			t.Errorf("%s: %+v, %v; want %s", key, r, err, state)
		} else if state == idemstore.StateInProgress && r.Response != nil {
			t.Errorf("%s: in progress with a response %+v", key, r.Response)
		}
	}
	var n int
	if err := s.DB().QueryRow("SELECT count(*) FROM side_effects").Scan(&n); err != nil || n != 0 {
		t.Errorf("side_effects has %d rows, %v; want the failed writes' rows undone", n, err)
	}
}

// TestGroupCommitAtomicWrites: the store's one-statement writes run
// without savepoints. One that loses its fence wrote nothing and the batch
// goes on; one whose statement fails (a constraint) makes the batch run its
// other writes again in a new transaction: it fails alone, the others
// commit once, in one commit, each having seen the ones before it.
func TestGroupCommitAtomicWrites(t *testing.T) {
	t.Parallel()
	s := openStore(t, nil)
	ctx := t.Context()
	id := func(key string) idemstore.Identity { return reserveParams(key, "").Identity }
	for _, key := range []string{"fenced", "bad-status", "done"} {
		reserve(t, s, id(key), "t-"+key)
	}
	complete := func(key, token string, status int) func() (*idemstore.ReserveResult, error) {
		return func() (*idemstore.ReserveResult, error) {
			return nil, s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id(key), Token: token,
				Response: &idemstore.Response{Status: status, Body: []byte(key)}})
		}
	}
	reserveKey := func(key, token string) func() (*idemstore.ReserveResult, error) {
		return func() (*idemstore.ReserveResult, error) { return s.KeyReserve(ctx, reserveParams(key, token)) }
	}
	// batch runs ops as one batch, in their order, and returns their results.
	batch := func(ops ...func() (*idemstore.ReserveResult, error)) ([]*idemstore.ReserveResult, []error) {
		wait, release := holdWriter(t, s)
		res, errs := make([]*idemstore.ReserveResult, len(ops)), make([]error, len(ops))
		var wg sync.WaitGroup
		for i, op := range ops {
			wg.Go(func() { res[i], errs[i] = op() })
			wait(i + 1)
		}
		commits0, writes0 := idemsqlite.BatchStats(s)
		release()
		wg.Wait()
		if commits, n := idemsqlite.BatchStats(s); commits-commits0 != 1 || n-writes0 != int64(len(ops)) {
			t.Fatalf("%d writes in %d commits, want %d in one", n-writes0, commits-commits0, len(ops))
		}
		return res, errs
	}

	_, errs := batch(complete("fenced", "stale", http.StatusCreated), complete("done", "t-done", http.StatusCreated))
	if !errors.Is(errs[0], idemstore.ErrLeaseLost) || errs[1] != nil {
		t.Fatalf("a lost fence, then a completion: %v; want ErrLeaseLost, nil", errs)
	}
	if n := idemsqlite.BatchReruns(s); n != 0 {
		t.Fatalf("a batch whose only failure lost its fence ran again (%d)", n)
	}

	res, errs := batch(reserveKey("a", "t-a1"), complete("fenced", "stale", http.StatusCreated),
		reserveKey("a", "t-a2"), complete("bad-status", "t-bad-status", 1000), reserveKey("b", "t-b"))
	for i, err := range errs {
		switch i {
		case 1:
			if !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Errorf("completing with a stale token: %v; want ErrLeaseLost", err)
			}
		case 3:
			if err == nil || errors.Is(err, idemstore.ErrLeaseLost) {
				t.Errorf("completing with status 1000: %v; want a constraint error", err)
			}
		default:
			if err != nil {
				t.Errorf("write %d failed with the batch's others: %v", i, err)
			}
		}
	}
	if n := idemsqlite.BatchReruns(s); n != 1 {
		t.Errorf("the batch ran again %d times, want once", n)
	}
	if errs[0] == nil && errs[2] == nil && (!res[0].Reserved || res[2].Reserved || res[2].Record.Token != "t-a1") {
		t.Errorf("two reservations of a new key in one batch: %+v, %+v; want the first to reserve and the second to find it", res[0], res[2])
	}
	want := map[string]string{"a": "t-a1", "b": "t-b", "bad-status": "t-bad-status", "fenced": "t-fenced"}
	for key, token := range want {
		r, err := s.KeyGet(ctx, id(key))
		if err != nil || r.State != idemstore.StateInProgress || r.Token != token || r.Response != nil {
			t.Errorf("%s: %+v, %v; want in progress under %s, without a response", key, r, err, token)
		}
	}
	if r, err := s.KeyGet(ctx, id("done")); err != nil || r.State != idemstore.StateCompleted {
		t.Errorf("done: %+v, %v; want completed", r, err)
	}
}

// TestGroupCommitCancelWhileQueued: a write whose context ends while it
// waits for the writer returns at once with the context's error and is
// never run, whether it waits in the queue or leads and waits for the write
// connection (held here as a transactional-mode transaction holds it); the
// next write in the queue then leads.
func TestGroupCommitCancelWhileQueued(t *testing.T) {
	t.Parallel()
	s := openStore(t, nil)
	wait, release := holdWriter(t, s)
	ctx := t.Context()
	leaderCtx, cancelLeader := context.WithCancel(ctx)
	followerCtx, cancelFollower := context.WithCancel(ctx)
	reserveIn := func(ctx context.Context, key string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := s.KeyReserve(ctx, reserveParams(key, "t"))
			done <- err
		}()
		return done
	}

	leader := reserveIn(leaderCtx, "leader")
	wait(1)
	kept := reserveIn(ctx, "kept")
	follower := reserveIn(followerCtx, "cancelled")
	wait(3)
	cancelFollower()
	if err := <-follower; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled follower: %v; want context.Canceled while the writer is still held", err)
	}
	cancelLeader()
	if err := <-leader; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled leader: %v; want context.Canceled while the writer is still held", err)
	}
	release()
	if err := <-kept; err != nil {
		t.Fatalf("the write queued behind them: %v", err)
	}
	for key, want := range map[string]error{"leader": idemstore.ErrNotFound, "cancelled": idemstore.ErrNotFound, "kept": nil} {
		if _, err := s.KeyGet(ctx, reserveParams(key, "").Identity); !errors.Is(err, want) {
			t.Errorf("KeyGet(%s) = %v; want %v", key, err, want)
		}
	}
}

// TestGroupCommitRunnableWritersJoin: the writers a commit wakes come back
// together with their next writes, and those share the next commit: the
// first of them back does not lead a batch of one while the others, ready
// to run, wait for the commit after. With one processor, so that the others
// are runnable but not running when the first leads; in several rounds, as
// the scheduler may now and then run the leader first anyway (a batch of
// one and then the others, which the group commit without yielding did in
// every round). Not parallel: it sets GOMAXPROCS.
func TestGroupCommitRunnableWritersJoin(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const writers, rounds = 8, 8
	s := openStore(t, nil)
	var sizes []int // the leader calls OnCommitted, one at a time
	idemsqlite.OnCommitted(s, func(n int) { sizes = append(sizes, n) })
	ctx := t.Context()
	joined := 0
	for round := range rounds {
		wait, release := holdWriter(t, s)
		sizes = sizes[:0]
		errs := make(chan error, writers)
		var wg sync.WaitGroup
		for i := range writers {
			p := reserveParams(fmt.Sprint("key-", round, "-", i), "t")
			wg.Go(func() {
				_, err := s.KeyReserve(ctx, p)
				if err == nil {
					err = s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: p.Identity, Token: "t", Response: created("x")})
				}
				errs <- err
			})
		}
		wait(writers)
		release()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("round %d: commits of %v writes", round, sizes)
		if len(sizes) == 0 || sizes[0] != writers {
			t.Fatalf("round %d: the reservations, queued together, committed as %v; want one commit", round, sizes)
		}
		if slices.Equal(sizes, []int{writers, writers}) {
			joined++
		}
	}
	if joined == 0 {
		t.Fatalf("in no round of %d did the completions share one commit", rounds)
	}
}
