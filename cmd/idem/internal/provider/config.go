package provider

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"time"
)

// DefaultStore is the provider's store when Config.Store is empty: a file of
// its own, apart from the payments service's store, as a bank's ledger is.
const DefaultStore = "sqlite:./idem-provider.db"

// Config configures a Provider. A nil *Config means all defaults.
type Config struct {
	// Store is the URL of the provider's idem store, which also holds the
	// ledger: sqlite:PATH (?synchronous=NORMAL is an option), postgres://…
	// (?schema=NAME, default public) or mysql://… (the URL's database).
	// Defaults to DefaultStore.
	Store string
	// Faults are the faults injected into POST /charges. Defaults to none.
	// Provider.SetFaults changes them while the provider runs.
	Faults Faults
	// Rand draws the faults; it is used under the provider's lock. Tests pass
	// a seeded one. Defaults to a randomly seeded source.
	Rand *mrand.Rand
	// Logger receives the provider's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock of the ledger and the idem store. Defaults to
	// time.Now.
	Now func() time.Time
}

// Faults are injected into POST /charges, each drawn per request. Lookups
// (GET) are never faulted: reconciliation must be able to ask.
type Faults struct {
	// FailRate is the probability, 0 to 1, of answering 503 before anything
	// is charged.
	FailRate float64
	// TimeoutRate is the probability, 0 to 1, of charging, committing and
	// then not answering: the connection is held until the client gives up
	// (or dropped at once, see DropConnection). A retry with the same key
	// finds the charge.
	TimeoutRate float64
	// Latency is added before each request is processed; a client that
	// gives up meanwhile is not charged.
	Latency time.Duration
	// DropConnection makes the timeout fault close the connection at once
	// instead of holding it: the client sees a broken connection, not a
	// timeout. Defaults to false.
	DropConnection bool
}

// Validate reports a rate outside 0–1 or a negative latency.
func (f Faults) Validate() error {
	for _, r := range []struct {
		name string
		v    float64
	}{{"fail rate", f.FailRate}, {"timeout rate", f.TimeoutRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			return fmt.Errorf("provider: the %s is %v; want 0 to 1", r.name, r.v)
		}
	}
	if f.Latency < 0 {
		return fmt.Errorf("provider: the latency is %v; want 0 or more", f.Latency)
	}
	return nil
}

// withDefaults returns a copy of c with every zero field set to its default.
// It is the only place defaults are applied.
func (c *Config) withDefaults() Config {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Store == "" {
		cfg.Store = DefaultStore
	}
	if cfg.Rand == nil {
		var seed [16]byte
		rand.Read(seed[:])
		cfg.Rand = mrand.New(mrand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:])))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}
