package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/idem-dev/idem"
)

// serve serves h on ln until ctx ends, then stops accepting, waits up to
// e.drainTimeout for the requests in flight and returns nil. A drain that
// runs out of time closes the remaining connections and returns an error.
// The caller closes its store after serve returns: no handler runs then,
// unless the drain ran out of time.
func serve(ctx context.Context, e *env, ln net.Listener, h http.Handler) error {
	return serveWith(ctx, e, ln, h, idem.DefaultBodyTimeout, nil)
}

// Server limits of every serving command.
const (
	// readHeaderTimeout bounds the request line and headers.
	readHeaderTimeout = 10 * time.Second
	// idleTimeout closes a keep-alive connection left idle.
	idleTimeout = 2 * time.Minute
	// maxHeaderBytes bounds the request line and headers (net/http's
	// default is 1 MiB).
	maxHeaderBytes = 64 << 10
)

// serveWith is serve with a bound on how long a request body may take to
// arrive, counted from the end of its headers. There is no ReadTimeout (it
// would also start counting during the handler: net/http then cancels the
// request's context) and no WriteTimeout (an upstream may take its own
// timeout to answer, and a large answer its time to stream).
//
// bounds, when not nil, reports the requests whose body h reads under a
// read deadline of its own, of the same bound (the idem middleware's
// Config.BodyTimeout): see bodyDeadline.
func serveWith(ctx context.Context, e *env, ln net.Listener, h http.Handler, bodyTimeout time.Duration, bounds func(*http.Request) bool) error {
	srv := &http.Server{
		Handler:           bodyDeadline(h, bodyTimeout, bounds),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(e.logger.Handler(), slog.LevelWarn),
	}
	if e.listening != nil {
		e.listening(ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lazyListener{ln}) }()
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

// bodyDeadline bounds the arrival of every request body to d: a read
// deadline on the connection from the start of the request, lifted when the
// body has been read to its end. The idem middleware sets its own (the same
// bound) and answers 408; for a request it does not protect, a body still
// arriving at the deadline fails to read, and the connection is closed.
//
// A request for which bounds reports true has its body read by h under a
// deadline of h's own, which h lifts: setting one here too, and lifting it,
// would only cost the connection's timer lock twice more per request. Only
// when h answered without reading the body to its end (the middleware
// refused the request before reading it) does the deadline start here,
// when h returns: net/http then reads what is left of the body (up to 256
// KiB) before it answers, and a client must not hold it there.
func bodyDeadline(h http.Handler, d time.Duration, bounds func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || d <= 0 {
			h.ServeHTTP(w, r)
			return
		}
		if bounds != nil && bounds(r) {
			body := &seesEOF{ReadCloser: r.Body}
			r.Body = body
			h.ServeHTTP(w, r)
			if !body.eof {
				_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
			}
			return
		}
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(d)) == nil {
			r.Body = &liftOnEOF{ReadCloser: r.Body, rc: rc}
		}
		h.ServeHTTP(w, r)
	})
}

// seesEOF reports whether the body was read to its end.
type seesEOF struct {
	io.ReadCloser
	eof bool
}

func (b *seesEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// liftOnEOF lifts the connection's read deadline when the body ends, so that
// it does not outlast the body (net/http reads the connection in the
// background during the handler, and a deadline there would cancel the
// request's context).
type liftOnEOF struct {
	io.ReadCloser
	rc     *http.ResponseController
	lifted bool
}

func (b *liftOnEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
