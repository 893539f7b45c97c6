package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// serve serves h on ln until ctx ends, then stops accepting, waits up to
// e.drainTimeout for the requests in flight and returns nil. A drain that
// runs out of time closes the remaining connections and returns an error.
// The caller closes its store after serve returns: no handler runs then,
// unless the drain ran out of time.
func serve(ctx context.Context, e *env, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(e.logger.Handler(), slog.LevelWarn),
	}
	if e.listening != nil {
		e.listening(ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	e.logger.Info("shutting down", "drain_timeout", e.drainTimeout)
	drainCtx, cancel := context.WithTimeout(context.Background(), e.drainTimeout)
	defer cancel()
	if err := srv.Shutdown(drainCtx); err != nil {
		srv.Close()
		return fmt.Errorf("draining the requests in flight: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", err)
	}
	e.logger.Info("stopped")
	return nil
}
