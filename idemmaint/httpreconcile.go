package idemmaint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/neverstored"
)

// Default values of the HTTPConfig fields.
const (
	DefaultLookupTimeout = 5 * time.Second
	DefaultLookupMaxBody = 1 << 20
)

// defaultStoredHeaders is idem.DefaultStoredHeaders() (a test keeps them
// equal): this package depends on the store contract, not on the middleware.
var defaultStoredHeaders = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
	"Location", "ETag", "Last-Modified",
}

// headerAttempt is idem.HeaderAttempt (a test keeps them equal): the
// lookup sends the token of the attempt it asks about in it.
const headerAttempt = "Idempotency-Attempt"

// HTTPConfig configures HTTPReconciler. A nil *HTTPConfig means all
// defaults.
type HTTPConfig struct {
	// Header is sent with every lookup, e.g. an Authorization header. A Host
	// entry sets the request's Host. Errors and logs never carry its
	// values. Defaults to none.
	Header http.Header
	// Timeout bounds one lookup, its answer's body included. Defaults to 5
	// seconds.
	Timeout time.Duration
	// MaxBody is the largest answer body stored for replay, in bytes. A 2xx
	// answer with a larger body settles the record as completed and not
	// replayable, as the middleware does with a response larger than its
	// MaxResponse. Defaults to 1 MiB (the middleware's default MaxResponse).
	MaxBody int64
	// StoredHeaders is the allow-list of the answer's headers stored for
	// replay; Set-Cookie, Authorization, hop-by-hop headers and
	// Content-Length are never stored. Defaults to the middleware's default
	// (idem.DefaultStoredHeaders()).
	StoredHeaders []string
	// Client sends the lookups: its Transport, Jar and Timeout are used,
	// never its CheckRedirect. A lookup never follows a redirect: a
	// redirect is an answer like any other 3xx, still unknown (the server
	// that cleaned the path or moved the resource may point anywhere).
	// Defaults to a client of its own.
	Client *http.Client
}

// HTTPReconciler returns a Config.Reconcile that settles an unknown record
// by asking an HTTP endpoint about it: it sends GET to the template's URL
// for the record, with cfg.Header, and reads the answer:
//
//   - 2xx: the operation was applied. The record becomes completed and its
//     retries replay this answer: its status, its allow-listed headers and
//     its body (or 409 not-replayable when the body is larger than
//     cfg.MaxBody).
//   - 404 or 410: the operation was never applied. The record becomes
//     released and the next retry executes it.
//   - anything else (a redirect included: it is never followed), or no
//     answer within cfg.Timeout: still unknown; the maintainer asks again
//     after a backoff. The error says why, without the URL (which holds
//     the key).
//
// A record whose lookup URL the template cannot make safely is not looked
// up: it stays unknown with the reason as its error (see
// URLTemplate.Expand).
//
// The endpoint must answer 404 or 410 only when it knows that the operation
// never happened: most servers answer 404 to a path they do not route too,
// and a template with a typo would then release every unknown record.
//
// The lookup carries the record's fencing token, the attempt it asks about,
// in the Idempotency-Attempt header (idem proxy sends the upstream the same
// token with the request). An endpoint that keeps the tokens of the
// attempts it ran can answer for that attempt, and one that answers 404 or
// 410 can refuse that attempt should it still arrive: the retry the
// release allows is a new attempt, with a new token. An answer may carry
// the header back; it is never stored for replay.
func HTTPReconciler(t *URLTemplate, cfg *HTTPConfig) func(context.Context, *idemstore.Record) (Resolution, error) {
	c := cfg.withDefaults()
	stored := make(map[string]bool, len(c.StoredHeaders))
	for _, h := range c.StoredHeaders {
		// The middleware's list of headers never stored (internal/neverstored)
		// applies to a lookup's answer too.
		if name := http.CanonicalHeaderKey(h); !neverstored.Has(name) {
			stored[name] = true
		}
	}
	return func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
		target, err := t.Expand(rec.Identity)
		if err != nil {
			return Resolution{}, err
		}
		ctx, cancel := context.WithTimeout(ctx, c.Timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return Resolution{}, fmt.Errorf("building the lookup: %w", withoutURL(err))
		}
		req.Header = c.Header.Clone()
		if req.Header == nil {
			req.Header = make(http.Header)
		}
		if host := req.Header.Get("Host"); host != "" {
			req.Host = host
			req.Header.Del("Host")
		}
		if req.Header.Get("User-Agent") == "" {
			req.Header.Set("User-Agent", "idem-reconciler")
		}
		req.Header.Set(headerAttempt, rec.Token)
		resp, err := c.Client.Do(req)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return Resolution{}, fmt.Errorf("no answer to the lookup within %v", c.Timeout)
			}
			return Resolution{}, fmt.Errorf("lookup failed: %w", withoutURL(err))
		}
		defer resp.Body.Close()
		switch code := resp.StatusCode; {
		case code >= 200 && code <= 299:
			body, err := io.ReadAll(io.LimitReader(resp.Body, c.MaxBody+1))
			if err != nil {
				return Resolution{}, fmt.Errorf("reading the lookup's %d answer: %w", code, withoutURL(err))
			}
			if int64(len(body)) > c.MaxBody {
				return Resolution{State: idemstore.StateCompleted}, nil // not replayable
			}
			header := make(http.Header)
			for name, vs := range resp.Header {
				if stored[name] {
					header[name] = vs
				}
			}
			return Resolution{State: idemstore.StateCompleted, Response: &idemstore.Response{Status: code, Header: header, Body: body}}, nil
		case code == http.StatusNotFound || code == http.StatusGone:
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
			return Resolution{State: idemstore.StateReleased}, nil
		default:
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			return Resolution{}, fmt.Errorf("the lookup answered %d %s", code, http.StatusText(code))
		}
	}
}

// withoutURL returns the cause of a *url.Error, whose text holds the URL
// and therefore the key.
func withoutURL(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}

// withDefaults returns a copy of cfg (which may be nil) with every zero field
// set to its default.
func (cfg *HTTPConfig) withDefaults() HTTPConfig {
	var c HTTPConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultLookupTimeout
	}
	if c.MaxBody <= 0 {
		c.MaxBody = DefaultLookupMaxBody
	}
	if c.StoredHeaders == nil {
		c.StoredHeaders = defaultStoredHeaders
	}
	var client http.Client
	if c.Client != nil {
		client = *c.Client // a copy: the caller's client keeps its own CheckRedirect
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.Client = &client
	return c
}
