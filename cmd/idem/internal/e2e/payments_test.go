package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/testenv"
)

// Waits of `idem payments` that the tests sit out on real time. keyLease
// is the lease of an idempotency key (--lease; 30 s by default, shortened
// here, renewed every third of it while a request runs), after which the
// key of a request killed in flight is released. relayClaim is how long a relay's claim on an
// outbox row lasts (3 × --deliver-timeout, plus the outbox's StoreTimeout
// of 5 s), after which the row of a relay killed during a delivery is
// attempted again.
const (
	keyLease       = 5 * time.Second
	deliverTimeout = time.Second
	relayClaim     = 3*deliverTimeout + 5*time.Second
)

// crashedRE finds the line the testing hook logs before the process kills
// itself, with the point it crashed at.
var crashedRE = regexp.MustCompile(`msg="testing hook: killing the process" crash_at=(\S+)`)

// TestPaymentsCrashMatrix kills `idem payments` (SIGKILL, by its testing
// hook IDEM_PAYMENTS_CRASH_AT) at each fault point of a payment, restarts
// it on the same SQLite store without the hook and retries the payment
// with the same key. The provider, `idem provider` with a durable ledger,
// is its own process and is not killed. Whatever the point, the ledger
// holds exactly one charge, made with the payment's derived key, and the
// payment ends succeeded.
//
//   - after_reserve: the key was reserved and nothing written. The client
//     gets no answer; its retry waits out the key's lease (409 key-in-use),
//     then executes: in transactional mode the expired lease proves that
//     nothing committed.
//   - after_commit: the payment, its outbox row and the key's completion
//     committed; the 201 was never sent. The retry gets the stored 201.
//   - after_charge: the provider charged, the outcome was not recorded. The
//     client had its 201; once the relay's claim has run out, the relay
//     asks the provider by the derived key, finds the charge and does not
//     charge again.
//   - mid_reconcile: the provider charges and never answers
//     (--timeout-rate 1), so the payment requires reconciliation; with
//     --max-attempts 1 the relay gives it up to the reconciler, which is
//     killed after asking the provider. After the restart the reconciler
//     asks again and settles the payment.
//
// The cases run in parallel, each with its own provider, store and ports.
func TestPaymentsCrashMatrix(t *testing.T) {
	t.Parallel()
	cases := []struct {
		point string
		// bankFaults and args are the provider's and the service's flags.
		bankFaults, args []string
		// answered: the first request gets its 201 before the crash; unsure:
		// it may or may not (the relay may charge and crash before the
		// answer leaves).
		answered, unsure bool
		// replayed: the retry gets the stored 201 (else a new execution).
		replayed bool
		// settleWithin bounds the wait for the payment to settle after the
		// retry: a relay's claim, for a relay killed during a delivery.
		settleWithin time.Duration
	}{
		{point: "after_reserve", answered: false, replayed: false, settleWithin: 20 * time.Second},
		{point: "after_commit", answered: false, replayed: true, settleWithin: relayClaim + 20*time.Second},
		{point: "after_charge", answered: true, unsure: true, replayed: true, settleWithin: relayClaim + 20*time.Second},
		{point: "mid_reconcile", bankFaults: []string{"--timeout-rate", "1"}, args: []string{"--max-attempts", "1"},
			answered: true, replayed: true, settleWithin: 20 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			began := time.Now()
			dir := t.TempDir()
			b := startBank(t, "sqlite:"+filepath.Join(dir, "provider.db"), tc.bankFaults...)
			s := newService(t, "sqlite:"+filepath.Join(dir, "payments.db"), b.URL, tc.args...)
			s.restart(tc.point)
			key := "order-" + tc.point
			const amount = 4200
			body := paymentBody("cus_"+tc.point, amount)

			first := postPayment(t.Context(), s.base(), key, body)
			s.wait(t, 30*time.Second)
			if !s.killedBySIGKILL() {
				t.Fatalf("the service ended with %v, not by SIGKILL at %s", s.cmd.ProcessState, tc.point)
			}
			if m := s.waitLine(crashedRE, time.Second); m == nil || m[1] != tc.point {
				t.Fatalf("the service did not log its crash at %s (got %q)", tc.point, m)
			}
			var firstID string
			switch {
			case tc.unsure && first.err != nil:
				// The crash came first: the retry gets the stored 201.
			case tc.answered && (first.err != nil || first.status != http.StatusCreated || first.replayed != ""):
				t.Fatalf("first request: %v, want 201 before the crash", first)
			case tc.answered:
				var p payment
				mustUnmarshal(t, first.body, &p)
				firstID = p.ID
			case first.err == nil:
				t.Fatalf("first request: %v, want no answer from the killed service", first)
			}
			t.Logf("first request: %v", first)

			s.restart("")
			c := newPayClient(t, keyLease+30*time.Second)
			p, err := createPayment(t.Context(), c, s.base(), key, body)
			if err != nil {
				t.Fatalf("retry after the restart: %v", err)
			}
			if p.replayed != tc.replayed {
				t.Fatalf("retry after the restart: replayed %v, want %v", p.replayed, tc.replayed)
			}
			if tc.point == "after_reserve" && p.attempts < 2 {
				t.Fatalf("retry after the restart: executed at the first attempt, within the killed attempt's lease")
			}
			if firstID != "" && p.ID != firstID {
				t.Fatalf("retry after the restart: payment %s, want %s from the first answer", p.ID, firstID)
			}

			got := awaitSettled(t, s.base(), []string{p.ID}, tc.settleWithin)[p.ID]
			charges := ledger(t, b.URL)
			if len(charges) != 1 {
				t.Fatalf("the ledger holds %d charges, want 1: %+v", len(charges), charges)
			}
			ch := charges[0]
			if ch.IdempotencyKey != providerKeyOf(key) || ch.Reference != p.ID || ch.AmountCents != amount {
				t.Fatalf("charge %+v, want key %s, reference %s, %d cents", ch, providerKeyOf(key), p.ID, amount)
			}
			if got.Status != "succeeded" || got.ChargeID != ch.ID {
				t.Fatalf("payment %+v, want succeeded with charge %s", got, ch.ID)
			}

			// Another retry is a replay of the same payment and charges
			// nothing.
			again, err := createPayment(t.Context(), c, s.base(), key, body)
			if err != nil || !again.replayed || again.ID != p.ID {
				t.Fatalf("a later retry: %+v err=%v, want the replay of %s", again, err, p.ID)
			}
			if n := len(ledger(t, b.URL)); n != 1 {
				t.Fatalf("the ledger holds %d charges after the later retry, want 1", n)
			}
			t.Logf("crash at %s: 1 payment %s (%s, retry took %d attempts), 1 charge; %v", tc.point, p.ID, got.Status,
				p.attempts, time.Since(began).Round(time.Millisecond))
		})
	}
}

// TestPaymentsSoakSQLite soaks `idem payments` on SQLite: see soakPayments.
func TestPaymentsSoakSQLite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	soakPayments(t, "sqlite:"+filepath.Join(dir, "payments.db"), dir)
}

// TestPaymentsSoakPostgres soaks `idem payments` on PostgreSQL, in a fresh
// schema: see soakPayments.
func TestPaymentsSoakPostgres(t *testing.T) {
	t.Parallel()
	soakPayments(t, pgSchemaURL(t, 12), t.TempDir())
}

// TestPaymentsSoakMySQL soaks `idem payments` on MySQL, in a fresh
// database: see soakPayments.
func TestPaymentsSoakMySQL(t *testing.T) {
	t.Parallel()
	soakPayments(t, newMyEnv(t).storeURL(12), t.TempDir())
}

// soakClients is the number of concurrent clients of a soak, and soakFor
// how long they start new payments.
const (
	soakClients = 50
	soakFor     = 15 * time.Second
)

// soakPause bounds the random pause of a client between two payments, so
// that the relays keep up and the drain stays short: the proof is about
// retries, faults and crashes, not throughput. Under -race everything is
// about ten times slower.
func soakPause() time.Duration {
	if testenv.RaceEnabled {
		return 1500 * time.Millisecond
	}
	return 150 * time.Millisecond
}

// soakPayments runs soakClients concurrent clients for soakFor, each
// creating payments one after another with keys of its own through the
// retrying client, while the provider refuses charges (--fail-rate) or
// charges and never answers (--timeout-rate) at random, and the service is
// killed (SIGKILL) and restarted on the same store twice. A client retries
// each payment with its key until it gets its 201. Then the provider is
// restarted without faults and the relays and the reconciler drain. Every
// payment a client got a 201 for exists and succeeded, the service has no
// other payment, and the ledger holds exactly one charge per payment, made
// with the payment's derived key, and no other charge.
func soakPayments(t *testing.T, store, dir string) {
	// The bank's ledger is SQLite in WAL mode with synchronous=NORMAL: a
	// committed charge survives the death of the process (not a power
	// cut), and the bank keeps up with the service's relays under -race.
	b := startBank(t, "sqlite:"+filepath.Join(dir, "provider.db")+"?synchronous=NORMAL",
		"--fail-rate", "0.2", "--timeout-rate", "0.05")
	s := newService(t, store, b.URL, "--relay-workers", "8", "--max-attempts", "30", "--settle-after", "2s")
	s.restart("")
	began := time.Now()
	c := newPayClient(t, keyLease+30*time.Second)

	type accepted struct {
		key    string
		amount int64
		created
	}
	var (
		results  [soakClients][]accepted
		failures = make(chan error, soakClients)
		stopNew  = make(chan struct{})
		giveUpAt = time.Now().Add(soakFor + 2*keyLease)
		wg       sync.WaitGroup
	)
	for i := range soakClients {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stopNew:
					return
				default:
				}
				time.Sleep(rand.N(soakPause()))
				key := fmt.Sprintf("soak-%02d-%05d", i, n)
				amount := int64(100 + 1000*i + n)
				body := paymentBody(fmt.Sprintf("cus_%02d", i), amount)
				for {
					got, err := createPayment(t.Context(), c, s.base(), key, body)
					if err == nil {
						results[i] = append(results[i], accepted{key: key, amount: amount, created: got})
						break
					}
					if time.Now().After(giveUpAt) || t.Context().Err() != nil {
						failures <- fmt.Errorf("client %d, key %s: %w", i, key, err)
						return
					}
				}
			}
		})
	}

	// Two crashes while the clients run, at half and three quarters of the
	// time: each stalls the clients it catches in flight for a key lease,
	// so the first half runs at full strength.
	for _, at := range []time.Duration{soakFor / 2, soakFor * 3 / 4} {
		time.Sleep(time.Until(began.Add(at))) // the clients run on real time
		killed := time.Now()
		killNow(t, s.proc)
		s.restart("")
		t.Logf("service killed at %v, listening again %v later", killed.Sub(began).Round(time.Millisecond),
			time.Since(killed).Round(time.Millisecond))
	}
	time.Sleep(time.Until(began.Add(soakFor)))
	close(stopNew)
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	clientsDone := time.Since(began)

	// The faults stop: the provider restarts without them, on its ledger.
	b.stop(t)
	faults := strings.Count(b.output(), "fault: failing before charging")
	timeouts := strings.Count(b.output(), "fault: processed, not answering")
	b.restart()
	settled, drain, course := awaitListSettled(t, s.base(), 90*time.Second)

	var (
		byKey                       = make(map[string]accepted)
		byID                        = make(map[string]accepted)
		attempts, replays, multiTry int
	)
	for i := range results {
		for _, a := range results[i] {
			if other, dup := byID[a.ID]; dup {
				t.Fatalf("keys %s and %s got the same payment %s", other.key, a.key, a.ID)
			}
			if a.AmountCents != a.amount {
				t.Fatalf("key %s: payment of %d cents, sent %d", a.key, a.AmountCents, a.amount)
			}
			byKey[a.key], byID[a.ID] = a, a
			attempts += a.attempts
			if a.replayed {
				replays++
			}
			if a.attempts > 1 {
				multiTry++
			}
		}
	}
	// The soak proves something only if the faults and the kills hit. On a
	// heavily loaded machine the relays reach the provider less often, so a
	// rare fault kind may not be drawn; each kind is also forced
	// deterministically elsewhere (the crash matrix's --timeout-rate 1, the
	// payments package's fail-rate tests), so one kind is enough here.
	if len(byID) < soakClients || multiTry == 0 || faults+timeouts == 0 {
		t.Fatalf("%d payments accepted (%d after retries), %d refusals and %d lost answers injected; "+
			"want at least one payment per client, retries, and injected faults", len(byID), multiTry, faults, timeouts)
	}
	if faults == 0 || timeouts == 0 {
		t.Logf("only one fault kind was drawn: %d refusals, %d lost answers", faults, timeouts)
	}
	// No payment lost, none made behind the clients' backs.
	for id, a := range byID {
		if settled[id] == nil {
			t.Fatalf("payment %s (key %s) was accepted and is not in the service", id, a.key)
		}
	}
	if len(settled) != len(byID) {
		t.Fatalf("the service has %d payments, the clients were given %d", len(settled), len(byID))
	}

	// One charge per payment, made with its derived key.
	charges := ledger(t, b.URL)
	chargeByKey := make(map[string]charge, len(charges))
	for _, ch := range charges {
		if _, dup := chargeByKey[ch.IdempotencyKey]; dup {
			t.Fatalf("the ledger holds two charges with key %s", ch.IdempotencyKey)
		}
		chargeByKey[ch.IdempotencyKey] = ch
	}
	statuses := make(map[string]int)
	for id, p := range settled {
		statuses[p.Status]++
		a := byID[id]
		ch, charged := chargeByKey[providerKeyOf(a.key)]
		switch {
		case p.Status != "succeeded":
			t.Errorf("payment %s (key %s) %s: %s; with the faults off every payment should succeed", id, a.key, p.Status, p.FailureReason)
		case !charged:
			t.Errorf("payment %s (key %s) succeeded without a charge in the ledger", id, a.key)
		case ch.ID != p.ChargeID || ch.Reference != id || ch.AmountCents != a.amount:
			t.Errorf("payment %s (key %s, %d cents, charge %s): the ledger has %+v", id, a.key, a.amount, p.ChargeID, ch)
		}
	}
	if len(charges) != len(byID) {
		t.Errorf("the ledger holds %d charges for %d payments", len(charges), len(byID))
	}
	t.Logf("%s: %d clients, %d payments accepted (%d after retries, %d replays, %d attempts in all) in %v; "+
		"%d charges (%d refusals, %d lost answers injected); %v; drained in %v (open: %s); %v in all",
		storeurl.Kind(store), soakClients, len(byID), multiTry, replays, attempts, clientsDone.Round(time.Millisecond),
		len(charges), faults, timeouts, statuses, drain.Round(time.Millisecond), course, time.Since(began).Round(time.Millisecond))
}
