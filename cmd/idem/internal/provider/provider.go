package provider

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// Provider is the simulated payment provider: an http.Handler serving
//
//	POST /charges                       create a charge (Idempotency-Key required)
//	GET  /charges                       the whole ledger, a JSON array
//	GET  /charges?after=SEQ&limit=N     a page of it: the charges after seq SEQ
//	GET  /charges?idempotency_key=KEY   the charge made with KEY, or 404
//	GET  /charges/{id}                  one charge, or 404
//
// Close it when done: it owns its store.
type Provider struct {
	cfg    Config
	log    *slog.Logger
	store  idemstore.TxStore
	ledger ledger
	mux    *http.ServeMux
	faults atomic.Pointer[Faults]

	randMu sync.Mutex // guards cfg.Rand

	inflight  sync.WaitGroup
	closing   chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// New opens the store cfg names (creating the ledger when missing) and
// returns the provider. cfg may be nil.
func New(cfg *Config) (*Provider, error) {
	c := cfg.withDefaults()
	if err := c.Faults.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, l, err := openStore(ctx, c.Store, c.Now)
	if err != nil {
		return nil, err
	}
	p := &Provider{
		cfg:     c,
		log:     c.Logger,
		store:   store,
		ledger:  l,
		mux:     http.NewServeMux(),
		closing: make(chan struct{}),
	}
	faults := c.Faults
	p.faults.Store(&faults)
	// The charge and the key's completion commit in one transaction: a
	// crash leaves both or neither, and a retry finds the charge.
	protect := idem.New(store, &idem.Config{
		RequireKey:  true,
		GuardConfig: idem.GuardConfig{Transactional: true, Lease: 5 * time.Second, Logger: c.Logger},
		// A charge takes milliseconds: a short lease lets a key whose
		// attempt died (or whose release failed) be retried soon.

	})
	p.mux.Handle("POST /charges", p.withFaults(protect(http.HandlerFunc(p.createCharge))))
	p.mux.HandleFunc("GET /charges", p.listCharges)
	p.mux.HandleFunc("GET /charges/{id}", p.getCharge)
	return p, nil
}

// ServeHTTP serves the provider's routes.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.inflight.Add(1)
	defer p.inflight.Done()
	p.mux.ServeHTTP(w, r)
}

// SetFaults replaces the injected faults for the requests that follow.
func (p *Provider) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.faults.Store(&f)
	return nil
}

// Faults returns the injected faults in force.
func (p *Provider) Faults() Faults { return *p.faults.Load() }

// Close releases the requests held by the timeout fault, waits for the
// requests in flight and closes the store. It is safe to call twice.
func (p *Provider) Close() error {
	p.closeOnce.Do(func() {
		close(p.closing)
		p.inflight.Wait()
		p.closeErr = p.ledger.close()
	})
	return p.closeErr
}

// Charges returns the whole ledger in the order the charges were made.
func (p *Provider) Charges(ctx context.Context) ([]Charge, error) {
	return p.ledger.list(ctx)
}

// ChargeByKey returns the charge made with the idempotency key, and false
// when there is none.
func (p *Provider) ChargeByKey(ctx context.Context, key string) (*Charge, bool, error) {
	c, err := p.ledger.byKey(ctx, key)
	if errors.Is(err, errNoCharge) {
		return nil, false, nil
	}
	return c, err == nil, err
}

// chargeRequest is the body of POST /charges.
type chargeRequest struct {
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference"`
}

// maxBody is the largest request body the middleware fingerprints (its
// default); a larger one is refused with 413.
const maxBody = 1 << 20

// maxReference bounds the reference's length.
const maxReference = 255

func (req *chargeRequest) validate() error {
	if req.AmountCents <= 0 {
		return errors.New("amount_cents must be a positive integer")
	}
	if len(req.Currency) != 3 || !isUpper(req.Currency) {
		return errors.New("currency must be a three-letter ISO 4217 code in capitals, e.g. EUR")
	}
	if len(req.Reference) > maxReference {
		return fmt.Errorf("reference must have at most %d bytes", maxReference)
	}
	return nil
}

func isUpper(s string) bool {
	for _, c := range []byte(s) {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// createCharge runs under the idem middleware in transactional mode: the
// key is reserved, and the charge commits with its completion.
func (p *Provider) createCharge(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req chargeRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON object")
	}
	if err == nil {
		err = req.validate()
	}
	if err != nil {
		// Rejected before any effect: the key is not kept, so the corrected
		// request may reuse it.
		idem.Reject(ctx)
		writeProblem(w, http.StatusBadRequest, "invalid-charge", "The charge request is invalid: "+err.Error())
		return
	}
	key, _ := idem.KeyFromContext(ctx)
	tx, err := idemstore.TxFromContext(ctx)
	if err != nil {
		p.fail(w, "beginning the transaction", key, err)
		return
	}
	c := &Charge{
		ID:             newChargeID(),
		IdempotencyKey: key,
		AmountCents:    req.AmountCents,
		Currency:       req.Currency,
		Reference:      req.Reference,
		CreatedAt:      time.UnixMicro(p.cfg.Now().UnixMicro()).UTC(),
	}
	existing, err := p.ledger.insert(ctx, tx, c)
	if err != nil {
		p.fail(w, "recording the charge", key, err)
		return
	}
	if existing != nil {
		// The ledger's own guard: the key's idempotency record is gone
		// (past its retention) but the charge is not.
		if existing.AmountCents != c.AmountCents || existing.Currency != c.Currency || existing.Reference != c.Reference {
			writeProblem(w, http.StatusUnprocessableEntity, idem.CodeKeyReused,
				"This Idempotency-Key was already used for another charge.")
			return
		}
		p.log.Debug("provider: charge exists for this key", "charge_id", existing.ID, "idempotency_key_hash", keyHash(key))
		writeJSON(w, http.StatusOK, existing)
		return
	}
	p.log.Debug("provider: charged", "charge_id", c.ID, "idempotency_key_hash", keyHash(key),
		"amount_cents", c.AmountCents, "currency", c.Currency)
	w.Header().Set("Location", "/charges/"+c.ID)
	writeJSON(w, http.StatusCreated, c)
}

// fail answers 500: the transaction rolls back and the key is released.
func (p *Provider) fail(w http.ResponseWriter, op, key string, err error) {
	p.log.Error("provider: "+op+" failed", "idempotency_key_hash", keyHash(key), "error", err)
	writeProblem(w, http.StatusInternalServerError, "internal", "The charge could not be recorded; nothing was charged. Retry.")
}

func (p *Provider) listCharges(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("idempotency_key") {
		key := r.URL.Query().Get("idempotency_key")
		c, err := p.ledger.byKey(r.Context(), key)
		p.answerCharge(w, c, err)
		return
	}
	var charges []Charge
	var err error
	if q := r.URL.Query(); q.Has("after") || q.Has("limit") {
		after, limit, perr := parsePage(q)
		if perr != nil {
			writeProblem(w, http.StatusBadRequest, "invalid-page", perr.Error())
			return
		}
		charges, err = p.ledger.page(r.Context(), after, limit)
	} else {
		charges, err = p.ledger.list(r.Context())
	}
	if err != nil {
		p.log.Error("provider: listing charges failed", "error", err)
		writeProblem(w, http.StatusServiceUnavailable, "ledger-unavailable", "The ledger could not be read.")
		return
	}
	writeJSON(w, http.StatusOK, charges)
}

// Paging of GET /charges: ?after=SEQ (default 0) and ?limit=N (1 to
// MaxPage, default DefaultPage).
const (
	DefaultPage = 100
	MaxPage     = 1000
)

// parsePage reads the after and limit parameters of a page of the ledger.
func parsePage(q url.Values) (after int64, limit int, err error) {
	limit = DefaultPage
	if v := q.Get("after"); q.Has("after") {
		after, err = strconv.ParseInt(v, 10, 64)
		if err != nil || after < 0 {
			return 0, 0, errors.New("after must be a charge's seq, a whole number of at least 0")
		}
	}
	if v := q.Get("limit"); q.Has("limit") {
		limit, err = strconv.Atoi(v)
		if err != nil || limit < 1 || limit > MaxPage {
			return 0, 0, fmt.Errorf("limit must be a whole number from 1 to %d", MaxPage)
		}
	}
	return after, limit, nil
}

func (p *Provider) getCharge(w http.ResponseWriter, r *http.Request) {
	c, err := p.ledger.byID(r.Context(), r.PathValue("id"))
	p.answerCharge(w, c, err)
}

func (p *Provider) answerCharge(w http.ResponseWriter, c *Charge, err error) {
	switch {
	case errors.Is(err, errNoCharge):
		writeProblem(w, http.StatusNotFound, "no-charge", "No charge matches.")
	case err != nil:
		p.log.Error("provider: reading a charge failed", "error", err)
		writeProblem(w, http.StatusServiceUnavailable, "ledger-unavailable", "The ledger could not be read.")
	default:
		writeJSON(w, http.StatusOK, c)
	}
}

// withFaults injects the configured faults around the protected handler.
func (p *Provider) withFaults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := p.Faults()
		fail, timeout := p.draw(f)
		if f.Latency > 0 {
			// Read the body first: once it is consumed the server notices a
			// client that hangs up, and the wait ends.
			body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
			if err != nil {
				return // the client went away
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			t := time.NewTimer(f.Latency)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return // the client gave up: nothing is charged
			case <-p.closing:
				t.Stop()
				return
			}
		}
		if fail {
			p.log.Warn("provider: fault: failing before charging", "fault", "fail")
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusServiceUnavailable, "provider-unavailable",
				"The provider is unavailable (injected fault); nothing was charged. Retry.")
			return
		}
		if !timeout {
			next.ServeHTTP(w, r)
			return
		}
		// Charge and commit, then lose the answer.
		lost := &lostResponse{header: make(http.Header)}
		next.ServeHTTP(lost, r)
		p.log.Warn("provider: fault: processed, not answering", "fault", "timeout", "status", lost.status)
		if f.DropConnection {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		select {
		case <-r.Context().Done():
		case <-p.closing:
		}
	})
}

// draw decides the request's faults.
func (p *Provider) draw(f Faults) (fail, timeout bool) {
	if f.FailRate == 0 && f.TimeoutRate == 0 {
		return false, false
	}
	p.randMu.Lock()
	defer p.randMu.Unlock()
	fail = p.cfg.Rand.Float64() < f.FailRate
	timeout = p.cfg.Rand.Float64() < f.TimeoutRate
	return fail, timeout
}

// lostResponse is the response the timeout fault never sends.
type lostResponse struct {
	header http.Header
	status int
}

func (l *lostResponse) Header() http.Header { return l.header }
func (l *lostResponse) WriteHeader(status int) {
	if l.status == 0 {
		l.status = status
	}
}
func (l *lostResponse) Write(b []byte) (int, error) {
	l.WriteHeader(http.StatusOK)
	return len(b), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, "internal", "The answer could not be encoded.")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeProblem answers an RFC 9457 problem.
func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	b, _ := json.Marshal(map[string]any{
		"type":   idem.DefaultProblemBaseURI + "provider-" + code,
		"title":  http.StatusText(status),
		"status": status,
		"detail": detail,
		"code":   code,
	})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func newChargeID() string {
	var b [12]byte
	rand.Read(b[:])
	return "ch_" + hex.EncodeToString(b[:])
}

// keyHash names an idempotency key in logs without revealing it: the
// idempotency_key_hash attribute, the first 16 hex digits of the key's
// SHA-256, as the outbox relay that sent it logs it.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}
