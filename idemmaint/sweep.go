package idemmaint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Sweep runs one sweeper pass: it calls KeySweep in batches of BatchSize
// until a batch comes back short or the pass times out, logs every record
// whose expired lease it settled, and returns how many it settled. It does
// not pause between batches.
func (m *Maintainer) Sweep(ctx context.Context) (int, error) {
	return m.sweep(ctx, 0)
}

// Reap runs one reaper pass: it calls KeyReap (one bounded statement per
// batch of BatchSize) until a batch comes back short or the pass times out,
// and returns how many records it deleted. It does not pause between
// batches.
func (m *Maintainer) Reap(ctx context.Context) (int, error) {
	return m.reap(ctx, 0)
}

func (m *Maintainer) sweep(parent context.Context, every time.Duration) (n int, err error) {
	m.sweepMu.Lock()
	defer m.sweepMu.Unlock()
	ctx, cancel := m.passContext(parent)
	defer cancel()
	defer func() {
		m.endPass(parent, "sweep", n, err, func(s *Stats, now time.Time) { s.LastSweep = now })
		if m.cfg.OnSweep != nil {
			m.cfg.OnSweep(n, err)
		}
	}()
	for {
		recs, err := m.store.KeySweep(ctx, &idemstore.SweepParams{Limit: m.cfg.BatchSize})
		if err != nil {
			return n, fmt.Errorf("idemmaint: sweeping expired leases: %w", err)
		}
		for _, rec := range recs {
			m.logSwept(rec)
		}
		n += len(recs)
		m.updateStats(func(s *Stats) { s.Swept += int64(len(recs)) })
		if len(recs) < m.cfg.BatchSize {
			return n, nil
		}
		if !pause(ctx, every) {
			return n, fmt.Errorf("idemmaint: sweeping expired leases: %w", ctx.Err())
		}
	}
}

// logSwept logs one record whose expired lease the sweeper settled.
func (m *Maintainer) logSwept(rec *idemstore.Record) {
	level, msg := slog.LevelInfo, "idemmaint: lease expired, key released"
	if rec.State == idemstore.StateUnknown {
		level, msg = slog.LevelWarn, "idemmaint: lease expired, outcome unknown until reconciled"
	}
	m.cfg.Logger.LogAttrs(context.Background(), level, msg,
		append(recordAttrs(rec),
			slog.String("state", string(rec.State)),
			slog.Int("attempts", rec.Attempts),
			slog.Time("locked_until", rec.LockedUntil))...)
}

func (m *Maintainer) reap(parent context.Context, every time.Duration) (n int, err error) {
	m.reapMu.Lock()
	defer m.reapMu.Unlock()
	ctx, cancel := m.passContext(parent)
	defer cancel()
	defer func() {
		if n > 0 {
			m.cfg.Logger.Info("idemmaint: reaped expired records", slog.Int("count", n))
		}
		m.endPass(parent, "reap", n, err, func(s *Stats, now time.Time) { s.LastReap = now })
		if m.cfg.OnReap != nil {
			m.cfg.OnReap(n, err)
		}
	}()
	for {
		got, err := m.store.KeyReap(ctx, &idemstore.ReapParams{Limit: m.cfg.BatchSize})
		if err != nil {
			return n, fmt.Errorf("idemmaint: reaping expired records: %w", err)
		}
		n += got
		m.updateStats(func(s *Stats) { s.Reaped += int64(got) })
		if got < m.cfg.BatchSize {
			return n, nil
		}
		if !pause(ctx, every) {
			return n, fmt.Errorf("idemmaint: reaping expired records: %w", ctx.Err())
		}
	}
}

// endPass records the end of a pass of job in the stats and logs its error.
// An error caused by parent being done (Stop, or the caller's cancellation)
// is neither logged nor counted: nothing failed.
func (m *Maintainer) endPass(parent context.Context, job string, n int, err error, last func(s *Stats, now time.Time)) {
	now := m.cfg.Now()
	failed := err != nil && parent.Err() == nil
	m.updateStats(func(s *Stats) {
		last(s, now)
		if failed {
			s.PassErrors++
		}
	})
	switch {
	case !failed:
	case errors.Is(err, context.DeadlineExceeded):
		m.cfg.Logger.Warn("idemmaint: pass timed out; the next pass carries on",
			slog.String("job", job), slog.Int("count", n), slog.Duration("pass_timeout", m.cfg.PassTimeout), slog.Any("error", err))
	default:
		m.cfg.Logger.Error("idemmaint: pass failed", slog.String("job", job), slog.Int("count", n), slog.Any("error", err))
	}
}

// recordAttrs names a record in logs without its raw key.
func recordAttrs(rec *idemstore.Record) []slog.Attr {
	return []slog.Attr{
		slog.String("key_hash", keyHash(rec.Identity)),
		slog.String("endpoint", rec.Endpoint),
		slog.String("scope", rec.Scope),
	}
}

// keyHash is the record's key_hash in logs, shared with the middleware.
func keyHash(id idemstore.Identity) string { return id.LogHash() }
