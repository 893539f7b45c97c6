package idem_test

import (
	"io"
	"log/slog"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testGuard returns a Guard on store whose every time decision (store-call
// deadlines, lease renewals, waits, Retry-After) runs on clock.
func testGuard(store idemstore.Store, clock *idemtest.Clock, cfg idem.GuardConfig) *idem.Guard {
	cfg.Clock = clock
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	return idem.NewGuard(store, &cfg)
}

func newTestClock() *idemtest.Clock {
	return idemtest.NewClock(time.Now().Truncate(time.Millisecond))
}
