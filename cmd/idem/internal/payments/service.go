package payments

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmaint"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/outbox"
)

// topicCharge is the outbox topic of a payment's charge.
const topicCharge = "provider.charge"

// chargeMessage is the payload of a charge's outbox row.
type chargeMessage struct {
	PaymentID string `json:"payment_id"`
}

// Service is the reference payments service: its HTTP API (Handler), its
// outbox relays and its reconciler (Start, Stop), on one database.
type Service struct {
	cfg      Config
	log      *slog.Logger
	db       *database
	provider *providerClient
	tokens   map[[sha256.Size]byte]string // SHA-256 of a token → tenant
	// demoToken is Config.DemoTenant's token; fresh reports that the
	// database held no payment when New opened it.
	demoToken string
	fresh     bool
	handler   http.Handler
	relays    []*outbox.Relay
	maint     *idemmaint.Maintainer
	ledger    ledgerScan // ReconcileLedgerOnce's state

	runMu    sync.Mutex
	started  bool
	stopping chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	closeErr error
}

// NewDemoToken returns a new random token for Config.DemoTenant.
func NewDemoToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "demo_" + hex.EncodeToString(b)
}

// DemoToken returns Config.DemoTenant's token, kept in the database; ""
// without a DemoTenant.
func (s *Service) DemoToken() string { return s.demoToken }

// Fresh reports whether the database held no payment when New opened it.
func (s *Service) Fresh() bool { return s.fresh }

// New opens the database cfg.Store names, applies its migrations and
// returns the service, not started. Close it when done.
func New(ctx context.Context, cfg *Config) (*Service, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	db, err := openDatabase(ctx, c.Store, c.Now)
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg:      c,
		log:      c.Logger,
		db:       db,
		provider: &providerClient{base: trimBase(c.ProviderURL), client: c.HTTPClient},
		tokens:   make(map[[sha256.Size]byte]string),
		stopping: make(chan struct{}),
	}
	exists, err := db.repo.anyPayment(ctx)
	if err != nil {
		db.close()
		return nil, fmt.Errorf("payments: reading the payments table: %w", err)
	}
	s.fresh = !exists
	if c.DemoTenant != "" {
		// The first start's token wins: concurrent first starts agree.
		token, err := db.repo.setting(ctx, "demo_token:"+c.DemoTenant, NewDemoToken())
		if err != nil {
			db.close()
			return nil, fmt.Errorf("payments: keeping the demo token: %w", err)
		}
		s.demoToken = token
		c.Tokens = map[string]string{c.DemoTenant: token}
		s.cfg.Tokens = c.Tokens
	}
	for tenant, token := range c.Tokens {
		s.tokens[sha256.Sum256([]byte(token))] = tenant
	}
	for range c.RelayWorkers {
		s.relays = append(s.relays, outbox.NewRelay(db.outbox, &outbox.RelayConfig{
			Deliver:        s.deliver,
			MaxAttempts:    c.MaxAttempts,
			Backoff:        outbox.Backoff{Base: c.BackoffBase, Max: c.BackoffMax},
			BatchSize:      20,
			PollInterval:   c.RelayInterval,
			PassTimeout:    3 * c.DeliverTimeout,
			DeliverTimeout: c.DeliverTimeout,
			Rand:           c.Rand,
			Logger:         c.Logger,
			Now:            c.Now,
		}))
	}
	// The idempotency records need sweeping and reaping; in transactional
	// mode none is ever unknown, so there is nothing for its reconciler.
	s.maint = idemmaint.New(db.store, &idemmaint.Config{Logger: c.Logger, Now: c.Now})
	s.handler = s.routes()
	return s, nil
}

// Handler returns the service's HTTP API.
func (s *Service) Handler() http.Handler { return s.handler }

// Store returns the idem store that holds the service's idempotency keys,
// for operators' tools (metrics, the console).
func (s *Service) Store() idemstore.Store { return idemcrypt.New(s.db.store, s.cfg.Keyring) }

// Maintainer returns the maintainer that sweeps and reaps the service's
// idempotency keys, for its Stats.
func (s *Service) Maintainer() *idemmaint.Maintainer { return s.maint }

// Outbox returns the service's outbox store.
func (s *Service) Outbox() outbox.Store { return s.db.outbox }

// Start starts the outbox relays, the reconciler and the key maintenance in
// the background and returns at once. They run until Stop or until ctx
// ends.
func (s *Service) Start(ctx context.Context) error {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	if s.started {
		return errors.New("payments: the service was already started or stopped")
	}
	s.started = true
	for _, r := range s.relays {
		if err := r.Start(ctx); err != nil {
			return err
		}
	}
	if err := s.maint.Start(ctx); err != nil {
		return err
	}
	s.wg.Go(func() { s.reconcileLoop(ctx) })
	return nil
}

// Stop stops the relays (the delivery in flight finishes and is recorded),
// the reconciler and the maintenance, and waits for them. It is safe to
// call twice, and without Start.
func (s *Service) Stop() {
	s.runMu.Lock()
	s.started = true
	s.runMu.Unlock()
	s.stopOnce.Do(func() { close(s.stopping) })
	for _, r := range s.relays {
		r.Stop()
	}
	s.maint.Stop()
	s.wg.Wait()
}

// Close stops the service and closes its database. It is safe to call
// twice.
func (s *Service) Close() error {
	s.Stop()
	s.runMu.Lock()
	defer s.runMu.Unlock()
	if s.db != nil {
		s.closeErr = s.db.close()
		s.db.close = func() error { return nil }
	}
	return s.closeErr
}

// RelayOnce runs one pass of the first relay: it delivers the due charges
// and returns how many it attempted. Tests drive the relay with it.
func (s *Service) RelayOnce(ctx context.Context) (int, error) {
	return s.relays[0].RunOnce(ctx)
}

// notifyRelays wakes the relays after a payment committed.
func (s *Service) notifyRelays() {
	for _, r := range s.relays {
		r.Notify()
	}
}

// crash calls the Crash testing hook at point.
func (s *Service) crash(point CrashPoint) {
	if s.cfg.Crash != nil {
		s.cfg.Crash(point)
	}
}

// now reads the clock at the microsecond precision of the columns.
func (s *Service) now() time.Time {
	return time.UnixMicro(s.cfg.Now().UnixMicro()).UTC()
}

// reconcileLoop runs ReconcileOnce, ReconcileLedgerOnce and PruneOnce
// every ReconcileInterval until Stop.
func (s *Service) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopping:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 3*s.cfg.DeliverTimeout)
		if _, err := s.ReconcileOnce(pctx); err != nil {
			s.log.Error("payments: reconciliation pass failed", "error", err)
		}
		lctx, lcancel := context.WithTimeout(ctx, 3*s.cfg.DeliverTimeout)
		if _, err := s.ReconcileLedgerOnce(lctx); err != nil {
			s.log.Error("payments: ledger reconciliation pass failed", "error", err)
		}
		lcancel()
		if _, err := s.PruneOnce(pctx); err != nil {
			s.log.Error("payments: pruning delivered outbox rows failed", "error", err)
		}
		cancel()
	}
}

// pruneBatch bounds one delete of PruneOnce, so that pruning never holds
// the outbox long.
const pruneBatch = 500

// PruneOnce deletes the outbox rows of charges delivered (done) longer ago
// than KeyTTL, in batches of pruneBatch, and returns how many it deleted.
// A delivered row is bookkeeping: the payment keeps its charge and status,
// and by then the key's record, whose replay might have led to it, is gone
// too. Rows still pending and dead letters are never pruned. The
// reconciler's loop runs it after each pass.
func (s *Service) PruneOnce(ctx context.Context) (int, error) {
	before := s.now().Add(-s.cfg.KeyTTL)
	total := 0
	for {
		n, err := s.db.outbox.MessagePrune(ctx, &outbox.PruneParams{Before: before, Limit: pruneBatch})
		total += n
		if err != nil {
			return total, fmt.Errorf("pruning delivered outbox rows: %w", err)
		}
		if n < pruneBatch {
			return total, nil
		}
	}
}

// String describes the service for logs.
func (s *Service) String() string {
	return fmt.Sprintf("payments(store=%s, provider=%s)", s.db.kind, s.provider.base)
}
