package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Outcome is what became of one delivery attempt.
type Outcome int

const (
	// OutcomeDelivered means the downstream accepted the message (or already
	// had it, deduplicated by the key): the message is done.
	OutcomeDelivered Outcome = iota + 1
	// OutcomeRetry means the attempt certainly had no effect (refused before
	// any work, e.g. a 503 or a refused connection): the message is sent
	// again after a backoff.
	OutcomeRetry
	// OutcomePermanent means the downstream will never accept the message
	// (e.g. a 4xx about its content): it is dead-lettered at once.
	OutcomePermanent
	// OutcomeUnknown means the attempt may or may not have had its effect (a
	// timeout, a connection dropped after the request was sent). The relay
	// never treats the message as new: RelayConfig.OnUnknown settles it if
	// set, and otherwise it is sent again after a backoff with the same
	// idempotency key, which the downstream deduplicates. An invalid Outcome
	// and a panic in a hook count as unknown.
	OutcomeUnknown
)

// String returns the outcome's name as the relay logs it.
func (o Outcome) String() string {
	switch o {
	case OutcomeDelivered:
		return "delivered"
	case OutcomeRetry:
		return "retry"
	case OutcomePermanent:
		return "permanent"
	case OutcomeUnknown:
		return "unknown"
	}
	return "invalid"
}

// ErrStarted is returned by Relay.Start when the relay was already started
// or stopped: a Relay runs once.
var ErrStarted = errors.New("outbox: relay already started or stopped")

// maxErrorLength bounds the last error stored with a message.
const maxErrorLength = 2000

// Relay delivers due outbox messages: in the background (Start, Stop) or
// one pass at a time (RunOnce). Several relays, in one process or many, may
// share a store: a message is claimed by one relay at a time.
type Relay struct {
	store Store
	cfg   RelayConfig
	log   *slog.Logger

	randMu sync.Mutex // guards cfg.Rand
	passMu sync.Mutex // serialises passes

	wake     chan struct{}
	stopping chan struct{}
	stopOnce sync.Once
	runMu    sync.Mutex
	started  bool
	wg       sync.WaitGroup
}

// NewRelay returns a relay on store. It panics when cfg or cfg.Deliver is
// nil: a relay without a delivery hook is a programming error.
func NewRelay(store Store, cfg *RelayConfig) *Relay {
	if cfg == nil || cfg.Deliver == nil {
		panic("outbox: NewRelay needs a RelayConfig with a Deliver hook")
	}
	c := cfg.withDefaults()
	return &Relay{
		store:    store,
		cfg:      c,
		log:      c.Logger,
		wake:     make(chan struct{}, 1),
		stopping: make(chan struct{}),
	}
}

// Start runs the relay in the background until Stop is called or ctx ends,
// and returns at once. Cancelling ctx also cancels the deliveries in flight;
// Stop lets the one in flight finish. It returns ErrStarted when the relay
// was already started or stopped.
func (r *Relay) Start(ctx context.Context) error {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	if r.started {
		return ErrStarted
	}
	r.started = true
	r.wg.Go(func() { r.run(ctx) })
	return nil
}

// Stop stops a started relay and waits for it: the delivery in flight
// finishes and is recorded, the other claimed messages are handed back. It
// is safe to call more than once, and without Start.
func (r *Relay) Stop() {
	r.runMu.Lock()
	r.started = true // a stopped relay cannot start
	r.runMu.Unlock()
	r.stopOnce.Do(func() { close(r.stopping) })
	r.wg.Wait()
}

// Notify wakes a started relay for a pass now, e.g. after a transaction
// that enqueued a message committed. It never blocks.
func (r *Relay) Notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Relay) run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-r.stopping:
			return
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-r.wake:
		}
		n, err := r.runOnce(ctx, r.stopping)
		if r.cfg.OnPass != nil {
			r.cfg.OnPass(n, err)
		}
		next := r.cfg.PollInterval
		if n >= r.cfg.BatchSize && err == nil {
			next = 0 // a full batch: more may be due
		}
		timer.Reset(next)
	}
}

// RunOnce runs one pass: it claims at most BatchSize due messages,
// delivers them one by one and records each outcome. It returns the number
// of messages attempted, and the errors of the store calls (a failed claim,
// outcomes that could not be recorded: those messages are sent again, with
// the same key, once their claim expires). It may be called while the relay
// runs; passes do not overlap.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	return r.runOnce(ctx, nil)
}

func (r *Relay) runOnce(ctx context.Context, stop <-chan struct{}) (int, error) {
	r.passMu.Lock()
	defer r.passMu.Unlock()
	passCtx, cancel := context.WithTimeout(ctx, r.cfg.PassTimeout)
	defer cancel()

	now := r.cfg.Now()
	msgs, err := r.store.MessageClaim(passCtx, &ClaimParams{
		Limit:        r.cfg.BatchSize,
		Now:          now,
		ClaimedUntil: now.Add(r.cfg.PassTimeout + r.cfg.StoreTimeout),
	})
	if err != nil {
		r.log.Error("outbox: claiming messages failed", "error", err)
		return 0, err
	}
	var errs []error
	n := 0
	deadline, _ := passCtx.Deadline()
	for i, m := range msgs {
		// A delivery that cannot get its whole DeliverTimeout before the
		// pass ends is handed back rather than cut short: a cut-short call
		// is an unknown outcome that need not have been.
		short := i > 0 && time.Until(deadline) < r.cfg.DeliverTimeout
		if passCtx.Err() != nil || closed(stop) || short {
			errs = append(errs, r.unclaim(ctx, msgs[i:])...)
			break
		}
		if err := r.attempt(passCtx, m); err != nil {
			errs = append(errs, err)
		}
		n++
	}
	return n, errors.Join(errs...)
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// attempt delivers one claimed message and records the outcome.
func (r *Relay) attempt(ctx context.Context, m *Message) error {
	log := r.log.With("outbox_id", m.ID, "topic", m.Topic, "attempt", m.Attempts, "idempotency_key_hash", keyHash(m.IdempotencyKey))
	if m.Attempts > r.cfg.MaxAttempts {
		// The claim of the last allowed attempt expired before its outcome
		// was recorded (its relay died): nobody knows what it did.
		log.Error("outbox: message dead-lettered: its last attempt was never recorded, the outcome is unknown",
			"outcome", OutcomeUnknown.String(), "state", string(StateDead))
		return r.finish(ctx, log, m, StateDead, time.Time{}, "outcome unknown: the last attempt's relay stopped before recording it")
	}

	outcome, err := r.call(ctx, "deliver", r.cfg.Deliver, *m)
	if outcome == OutcomeUnknown && r.cfg.OnUnknown != nil {
		// A budget of its own: the delivery may have spent all of its
		// (the typical unknown outcome is a timeout).
		log.Warn("outbox: delivery outcome unknown, reconciling", "error", err)
		settled, rerr := r.call(ctx, "on_unknown", r.cfg.OnUnknown, *m)
		if settled != OutcomeUnknown {
			log.Info("outbox: unknown outcome reconciled", "outcome", settled.String(), "error", rerr)
			outcome, err = settled, rerr
		} else if rerr != nil {
			err = fmt.Errorf("%w (reconciling: %w)", err, rerr)
		}
	}

	switch outcome {
	case OutcomeDelivered:
		if err != nil {
			log.Warn("outbox: delivered, with an error", "error", err)
		}
		log.Debug("outbox: message delivered", "outcome", outcome.String())
		return r.finish(ctx, log, m, StateDone, time.Time{}, "")
	case OutcomePermanent:
		log.Error("outbox: message dead-lettered: permanent failure", "outcome", outcome.String(), "error", err)
		return r.finish(ctx, log, m, StateDead, time.Time{}, errorText(outcome, err))
	}
	if m.Attempts >= r.cfg.MaxAttempts {
		log.Error("outbox: message dead-lettered: no attempts left", "outcome", outcome.String(),
			"max_attempts", r.cfg.MaxAttempts, "error", err)
		return r.finish(ctx, log, m, StateDead, time.Time{}, errorText(outcome, err))
	}
	wait := r.jitter(r.cfg.Backoff.Cap(m.Attempts))
	due := r.cfg.Now().Add(wait)
	log.Warn("outbox: delivery failed, will retry with the same key", "outcome", outcome.String(),
		"retry_in", wait.String(), "error", err)
	return r.finish(ctx, log, m, StatePending, due, errorText(outcome, err))
}

// call runs a hook under DeliverTimeout, turning a panic or an invalid
// outcome into OutcomeUnknown: the hook may have sent the message.
func (r *Relay) call(ctx context.Context, name string, hook func(context.Context, Message) (Outcome, error), m Message) (outcome Outcome, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.DeliverTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			outcome, err = OutcomeUnknown, fmt.Errorf("%s panicked: %v", name, p)
		}
	}()
	outcome, err = hook(ctx, m)
	switch outcome {
	case OutcomeDelivered, OutcomeRetry, OutcomePermanent, OutcomeUnknown:
		return outcome, err
	}
	return OutcomeUnknown, errors.Join(fmt.Errorf("%s returned an invalid outcome %d", name, int(outcome)), err)
}

func (r *Relay) jitter(limit time.Duration) time.Duration {
	if limit <= 0 {
		return 0
	}
	if r.cfg.Rand == nil {
		return rand.N(limit + 1)
	}
	r.randMu.Lock()
	defer r.randMu.Unlock()
	return time.Duration(r.cfg.Rand.Int64N(int64(limit) + 1))
}

// finish records an outcome on a context detached from the pass, so an
// attempt made is recorded even when the relay is being cancelled.
func (r *Relay) finish(ctx context.Context, log *slog.Logger, m *Message, st State, due time.Time, lastErr string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StoreTimeout)
	defer cancel()
	now := r.cfg.Now()
	if due.IsZero() {
		due = now
	}
	err := r.store.MessageFinish(ctx, &FinishParams{
		ID: m.ID, Attempt: m.Attempts, State: st, AvailableAt: due, LastError: lastErr, Now: now,
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrClaimLost):
		// The claim expired and another relay took the message over; its
		// outcome is the one that counts.
		log.Warn("outbox: claim lost before the outcome was recorded", "state", string(st))
		return nil
	default:
		log.Error("outbox: recording the outcome failed; the message will be sent again when its claim expires",
			"state", string(st), "error", err)
		return err
	}
}

// unclaim hands back messages the pass did not attempt.
func (r *Relay) unclaim(ctx context.Context, msgs []*Message) []error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StoreTimeout)
	defer cancel()
	var errs []error
	for _, m := range msgs {
		err := r.store.MessageUnclaim(ctx, &UnclaimParams{ID: m.ID, Attempt: m.Attempts, Now: r.cfg.Now()})
		if err != nil && !errors.Is(err, ErrClaimLost) {
			r.log.Error("outbox: handing back a claimed message failed; it waits for its claim to expire",
				"outbox_id", m.ID, "topic", m.Topic, "error", err)
			errs = append(errs, err)
		}
	}
	return errs
}

// errorText is the last error stored for a failed attempt.
func errorText(o Outcome, err error) string {
	text := o.String()
	if o == OutcomeUnknown {
		text = "outcome unknown"
	}
	if err != nil {
		text += ": " + err.Error()
	}
	if len(text) > maxErrorLength {
		text = text[:maxErrorLength]
	}
	// PostgreSQL text holds neither NUL nor invalid UTF-8 (a cut rune).
	return strings.ToValidUTF8(strings.ReplaceAll(text, "\x00", ""), "\uFFFD")
}

// keyHash names an idempotency key in logs without revealing it: the
// idempotency_key_hash attribute, the first 16 hex digits of the key's
// SHA-256, as the downstream's and idemclient's logs name it.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}
