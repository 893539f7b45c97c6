package idem_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// The transactional mode (SPEC section 5) on the memory store's
// copy-on-write transactions: the handler's business writes are
// idemmem.Tx values, which commit with the key's completion or not at all.
// The SQL stores prove the same against real databases in their own
// packages.

const txLease = time.Minute

// txBundle is what txSetup returns: a memory store on a test clock, the
// middleware in transactional mode around a handler that is told its call
// number, and the captured log.
type txBundle struct {
	clock   *idemtest.Clock
	store   *idemmem.Store
	calls   atomic.Int64
	handler http.Handler
	logs    *syncBuffer
}

// txFaults makes the store's transactions fail to begin, commit or roll
// back, or its lease renewals fail (the heartbeat cannot reach the store).
type txFaults struct {
	begin, commit, rollback, renew error
}

func txSetup(t *testing.T, cfg *idem.Config, faults *txFaults, h func(w http.ResponseWriter, r *http.Request, call int64)) *txBundle {
	t.Helper()
	b := &txBundle{clock: idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), logs: &syncBuffer{}}
	b.store = idemmem.New(&idemmem.Config{Now: b.clock.Now})
	var c idem.Config
	if cfg != nil {
		c = *cfg
	}
	c.Transactional = true
	c.Clock = b.clock
	c.Lease = txLease
	c.Logger = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var store idemstore.Store = b.store
	if faults != nil {
		store = &faultyTxStore{Store: b.store, faults: *faults}
	}
	store = idemtest.CheckReserveResults(t, store) // the middleware only reads a reserve's record
	b.handler = idem.New(store, &c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h(w, r, b.calls.Add(1))
	}))
	t.Cleanup(func() {
		if strings.Contains(b.logs.String(), "key-one") {
			t.Errorf("a raw key appeared in the log:\n%s", b.logs.String())
		}
	})
	return b
}

func (b *txBundle) do(t *testing.T, key, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(idem.HeaderKey, key)
	w := httptest.NewRecorder()
	b.handler.ServeHTTP(w, r)
	return w
}

// record returns the only record in the store, or nil when there is none.
func (b *txBundle) record(t *testing.T) *idemstore.Record {
	t.Helper()
	recs, err := b.store.KeyList(t.Context(), &idemstore.ListParams{})
	if err != nil {
		t.Fatalf("KeyList: %v", err)
	}
	switch len(recs) {
	case 0:
		return nil
	case 1:
		return recs[0]
	}
	t.Fatalf("%d records, want at most 1", len(recs))
	return nil
}

// requireValues checks the committed business writes.
func (b *txBundle) requireValues(t *testing.T, want map[string]string) {
	t.Helper()
	got := b.store.Values()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("committed values %v, want %v", got, want)
	}
}

// put writes a business value through the request's transaction.
func put(r *http.Request, name, value string) error {
	tx, err := idemmem.TxFromContext(r.Context())
	if err != nil {
		return err
	}
	return tx.Put(name, value)
}

// phaseTx is the memory transaction a phase runs in (nil for any other).
func phaseTx(tx idemstore.Tx) *idemmem.Tx {
	mtx, _ := idemmem.TxFrom(tx)
	return mtx
}

// faultyTxStore is a memory store whose transactions fail as told.
type faultyTxStore struct {
	*idemmem.Store
	faults txFaults
}

func (s *faultyTxStore) KeyBeginTx(ctx context.Context) (idemstore.Tx, error) {
	if s.faults.begin != nil {
		return nil, s.faults.begin
	}
	tx, err := s.Store.KeyBeginTx(ctx)
	if err != nil {
		return nil, err
	}
	return &faultyTx{Tx: tx, faults: s.faults}, nil
}

func (s *faultyTxStore) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	if s.faults.renew != nil {
		return s.faults.renew
	}
	return s.Store.KeyRenew(ctx, p)
}

type faultyTx struct {
	idemstore.Tx
	faults txFaults
}

func (t *faultyTx) Commit(ctx context.Context) error {
	if t.faults.commit != nil {
		t.Tx.Rollback(ctx)
		return t.faults.commit
	}
	return t.Tx.Commit(ctx)
}

func (t *faultyTx) Rollback(ctx context.Context) error {
	if err := t.Tx.Rollback(ctx); err != nil {
		return err
	}
	return t.faults.rollback
}

// TestTransactionalOutcomes runs the after-handler policy of SPEC section 3
// in transactional mode: what is stored commits with the handler's business
// write; a release, an unknown outcome and a rejection roll it back.
func TestTransactionalOutcomes(t *testing.T) {
	t.Parallel()
	const (
		replays = "replays"
		reruns  = "reruns"
		unknown = "unknown"
	)
	for _, tc := range []struct {
		name    string
		profile idem.Profile
		status  int
		mark    func(context.Context) bool // MarkUnknown or Reject
		untaken bool                       // the handler never touches the transaction
		state   idemstore.State            // "" for no record
		retry   string
	}{
		{name: "201 commits", status: 201, state: idemstore.StateCompleted, retry: replays},
		{name: "201 without business writes commits", status: 201, untaken: true, state: idemstore.StateCompleted, retry: replays},
		{name: "404 commits", status: 404, state: idemstore.StateCompleted, retry: replays},
		{name: "500 rolls back", status: 500, state: idemstore.StateReleased, retry: reruns},
		{name: "502 rolls back in the stripe profile", profile: idem.ProfileStripe, status: 502, state: idemstore.StateReleased, retry: reruns},
		{name: "408 rolls back", status: 408, state: idemstore.StateReleased, retry: reruns},
		{name: "425 rolls back", status: 425, state: idemstore.StateReleased, retry: reruns},
		{name: "429 rolls back", status: 429, state: idemstore.StateReleased, retry: reruns},
		{name: "500 without business writes", status: 500, untaken: true, state: idemstore.StateReleased, retry: reruns},
		{name: "MarkUnknown rolls back", status: 502, mark: idem.MarkUnknown, state: idemstore.StateUnknown, retry: unknown},
		{name: "MarkUnknown with 201 rolls back", status: 201, mark: idem.MarkUnknown, state: idemstore.StateUnknown, retry: unknown},
		{name: "Reject rolls back and drops the key", status: 400, mark: idem.Reject, state: "", retry: reruns},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := txSetup(t, &idem.Config{Profile: tc.profile}, nil, func(w http.ResponseWriter, r *http.Request, call int64) {
				status := tc.status
				if call > 1 {
					status = http.StatusCreated // the retry succeeds
				} else if tc.mark != nil && !tc.mark(r.Context()) {
					t.Error("the context helper refused a protected request")
				}
				if !tc.untaken || call > 1 {
					if err := put(r, fmt.Sprint("payment-", call), "1000"); err != nil {
						t.Error(err)
					}
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				fmt.Fprintf(w, `{"call":%d}`, call)
			})
			first := b.do(t, "key-one", `{"amount":1000}`)
			if first.Code != tc.status || first.Body.String() != `{"call":1}` {
				t.Fatalf("first answer %d %s, want the handler's %d", first.Code, first.Body, tc.status)
			}
			stored := tc.state == idemstore.StateCompleted && !tc.untaken
			rec := b.record(t)
			switch {
			case tc.state == "" && rec != nil:
				t.Fatalf("record %s, want none", rec.State)
			case tc.state != "" && (rec == nil || rec.State != tc.state):
				t.Fatalf("record %+v, want %s", rec, tc.state)
			case tc.state == idemstore.StateCompleted && (rec.Response == nil || rec.Response.Status != tc.status):
				t.Fatalf("completed record's response %+v, want status %d", rec.Response, tc.status)
			}
			if stored {
				b.requireValues(t, map[string]string{"payment-1": "1000"})
			} else {
				b.requireValues(t, map[string]string{})
			}

			retry := b.do(t, "key-one", `{"amount":1000}`)
			switch tc.retry {
			case replays:
				if retry.Code != first.Code || retry.Body.String() != first.Body.String() || retry.Header().Get(idem.HeaderReplayed) != "true" {
					t.Fatalf("retry %d %s %v, want the first answer replayed", retry.Code, retry.Body, retry.Header())
				}
			case reruns:
				if retry.Code != http.StatusCreated || retry.Header().Get(idem.HeaderReplayed) != "" {
					t.Fatalf("retry %d %s, want a second execution", retry.Code, retry.Body)
				}
				b.requireValues(t, map[string]string{"payment-2": "1000"})
				if rec := b.record(t); rec == nil || rec.State != idemstore.StateCompleted {
					t.Fatalf("record after the retry %+v, want completed", rec)
				}
			case unknown:
				requireProblem(t, retry, http.StatusConflict, "outcome-unknown")
			}
			if want := map[string]int64{replays: 1, reruns: 2, unknown: 1}[tc.retry]; b.calls.Load() != want {
				t.Fatalf("%d executions, want %d", b.calls.Load(), want)
			}
		})
	}
}

// A panic rolls the transaction back and releases the key: nothing was
// committed, so the retry executes.
func TestTransactionalPanicReleases(t *testing.T) {
	t.Parallel()
	for _, v := range []any{"boom", http.ErrAbortHandler} {
		t.Run(fmt.Sprint(v), func(t *testing.T) {
			t.Parallel()
			b := txSetup(t, nil, nil, func(w http.ResponseWriter, r *http.Request, call int64) {
				if err := put(r, fmt.Sprint("payment-", call), "1000"); err != nil {
					t.Error(err)
				}
				if call == 1 {
					panic(v)
				}
				w.WriteHeader(http.StatusCreated)
			})
			func() {
				defer func() {
					if got := recover(); got != v {
						t.Fatalf("the server got the panic %v, want %v", got, v)
					}
				}()
				b.do(t, "key-one", "{}")
			}()
			if rec := b.record(t); rec == nil || rec.State != idemstore.StateReleased {
				t.Fatalf("record after the panic %+v, want released", rec)
			}
			b.requireValues(t, map[string]string{})
			if !strings.Contains(b.logs.String(), "transaction rolled back, key released") {
				t.Fatalf("the rollback was not logged:\n%s", b.logs)
			}
			if w := b.do(t, "key-one", "{}"); w.Code != http.StatusCreated {
				t.Fatalf("retry %d %s", w.Code, w.Body)
			}
			b.requireValues(t, map[string]string{"payment-2": "1000"})
		})
	}
}

// An attempt whose lease was taken over while it ran cannot commit: its
// business write is rolled back and its client is told to retry, which
// replays the newer attempt's result.
func TestTransactionalLeaseLostBeforeCommit(t *testing.T) {
	t.Parallel()
	var takeover *httptest.ResponseRecorder
	var b *txBundle
	// The heartbeat cannot reach the store: moving the clock lets the
	// lease lapse instead of renewing it.
	b = txSetup(t, nil, &txFaults{renew: errOutage}, func(w http.ResponseWriter, r *http.Request, call int64) {
		if err := put(r, fmt.Sprint("payment-", call), "1000"); err != nil {
			t.Error(err)
		}
		if call == 1 {
			// The lease lapses and a retry takes the key over (an expired
			// lease in transactional mode is released: nothing committed).
			b.clock.Advance(txLease + time.Second)
			takeover = b.do(t, "key-one", "{}")
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "call %d", call)
	})
	first := b.do(t, "key-one", "{}")
	requireProblem(t, first, http.StatusConflict, "key-in-use")
	if takeover.Code != http.StatusCreated || takeover.Body.String() != "call 2" {
		t.Fatalf("the takeover answered %d %s", takeover.Code, takeover.Body)
	}
	b.requireValues(t, map[string]string{"payment-2": "1000"})
	if rec := b.record(t); rec == nil || rec.State != idemstore.StateCompleted || rec.Attempts != 2 {
		t.Fatalf("record %+v, want completed by the second attempt", rec)
	}
	if w := b.do(t, "key-one", "{}"); w.Body.String() != "call 2" || w.Header().Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("retry %d %s, want the takeover's answer replayed", w.Code, w.Body)
	}
	if !strings.Contains(b.logs.String(), "lease lost before commit") {
		t.Fatalf("the lost lease was not logged:\n%s", b.logs)
	}
}

// A transaction that cannot begin or commit never yields a success: the
// client gets 503 (or the handler's own error), nothing is written, and the
// key is released for a retry. A failed rollback is logged.
func TestTransactionalStoreFailures(t *testing.T) {
	t.Parallel()
	errDisk := errors.New("disk full")
	for _, tc := range []struct {
		name    string
		faults  txFaults
		untaken bool
		answer  int // the handler's status, 201 when 0
		status  int
		logged  string
	}{
		{name: "commit fails", faults: txFaults{commit: errDisk}, status: http.StatusServiceUnavailable, logged: "committing the business transaction failed"},
		{name: "begin fails in the handler", faults: txFaults{begin: errDisk}, status: http.StatusInternalServerError},
		{name: "begin fails at completion", faults: txFaults{begin: errDisk}, untaken: true, status: http.StatusServiceUnavailable},
		{name: "rollback fails", faults: txFaults{rollback: errDisk}, answer: http.StatusBadGateway, status: http.StatusBadGateway, logged: "rolling back the business transaction failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := txSetup(t, nil, &tc.faults, func(w http.ResponseWriter, r *http.Request, call int64) {
				if !tc.untaken {
					if err := put(r, "payment", "1000"); err != nil {
						http.Error(w, "no transaction", http.StatusInternalServerError)
						return
					}
				}
				w.WriteHeader(cmp.Or(tc.answer, http.StatusCreated))
			})
			w := b.do(t, "key-one", "{}")
			if tc.status == http.StatusServiceUnavailable {
				requireProblem(t, w, tc.status, "store-unavailable")
			} else if w.Code != tc.status {
				t.Fatalf("answer %d %s, want %d", w.Code, w.Body, tc.status)
			}
			b.requireValues(t, map[string]string{})
			if rec := b.record(t); rec == nil || rec.State != idemstore.StateReleased {
				t.Fatalf("record %+v, want released", rec)
			}
			if !strings.Contains(b.logs.String(), tc.logged) {
				t.Fatalf("the log does not say %q:\n%s", tc.logged, b.logs)
			}
		})
	}
}

// TestTransactionalRace: 200 concurrent requests with one key, on a new key
// and on a released one, execute the handler once and commit one business
// write; every other request is answered 409 or with the replay.
func TestTransactionalRace(t *testing.T) {
	t.Parallel()
	for _, released := range []bool{false, true} {
		t.Run(fmt.Sprint("released=", released), func(t *testing.T) {
			t.Parallel()
			b := txSetup(t, nil, nil, func(w http.ResponseWriter, r *http.Request, call int64) {
				if err := put(r, fmt.Sprint("payment-", call), "1000"); err != nil {
					t.Error(err)
				}
				if released && call == 1 {
					w.WriteHeader(http.StatusBadGateway)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "call %d", call)
			})
			srv := httptest.NewServer(b.handler)
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
			post := func() (*http.Response, string, error) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", strings.NewReader(`{"amount":1000}`))
				req.Header.Set(idem.HeaderKey, "key-one")
				resp, err := client.Do(req)
				if err != nil {
					return nil, "", err
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				return resp, string(body), err
			}
			want := int64(1)
			if released {
				if resp, body, err := post(); err != nil || resp.StatusCode != http.StatusBadGateway {
					t.Fatalf("the failing attempt: %v %s %v", resp, body, err)
				}
				want = 2
			}
			var wg sync.WaitGroup
			var created, replayed, inUse, other atomic.Int64
			start := make(chan struct{})
			for range 200 {
				wg.Go(func() {
					<-start
					resp, body, err := post()
					switch {
					case err != nil:
						other.Add(1)
					case resp.StatusCode == 201 && body == fmt.Sprint("call ", want) && resp.Header.Get(idem.HeaderReplayed) == "true":
						replayed.Add(1)
					case resp.StatusCode == 201 && body == fmt.Sprint("call ", want):
						created.Add(1)
					case resp.StatusCode == 409 && strings.Contains(body, "key-in-use"):
						inUse.Add(1)
					default:
						other.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			if b.calls.Load() != want || created.Load() != 1 || other.Load() != 0 || replayed.Load()+inUse.Load() != 199 {
				t.Fatalf("executions %d created %d replayed %d in-use %d other %d; want %d execution(s), 1 created, 199 replayed or in use",
					b.calls.Load(), created.Load(), replayed.Load(), inUse.Load(), other.Load(), want)
			}
			b.requireValues(t, map[string]string{fmt.Sprint("payment-", want): "1000"})
			if rec := b.record(t); rec == nil || rec.State != idemstore.StateCompleted || rec.Attempts != int(want) {
				t.Fatalf("record %+v, want completed after %d attempt(s)", rec, want)
			}
		})
	}
}
