package e2e

import (
	"net/http"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// Waits of `idem payments` that the tests sit out on real time. keyLease
// is the lease of an idempotency key (idem.Config.Lease, 30 s by default;
// the command has no flag for it), after which the key of a request killed
// in flight is released. relayClaim is how long a relay's claim on an
// outbox row lasts (3 × --deliver-timeout, plus the outbox's StoreTimeout
// of 5 s), after which the row of a relay killed during a delivery is
// attempted again.
const (
	keyLease       = 30 * time.Second
	deliverTimeout = 250 * time.Millisecond
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
			b := startBank(t, dir, tc.bankFaults...)
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
			c := newPayClient(keyLease + 30*time.Second)
			p, err := createPayment(t.Context(), c, s.base(), key, body)
			if err != nil {
				t.Fatalf("retry after the restart: %v", err)
			}
			if p.replayed != tc.replayed {
				t.Fatalf("retry after the restart: replayed %v, want %v", p.replayed, tc.replayed)
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
