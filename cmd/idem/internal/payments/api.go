package payments

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/outbox"
)

// Page sizes of GET /v1/payments.
const (
	defaultPageSize = 20
	maxPageSize     = 100
)

// problemTypeBase prefixes the problem codes, as the middleware's default:
// each leads to the README's row for it.
const problemTypeBase = idem.DefaultProblemBaseURI

// routes builds the API:
//
//	POST /v1/payments        create (Idempotency-Key required, transactional)
//	GET  /v1/payments/{id}   one payment of the caller's tenant
//	GET  /v1/payments        the caller's payments, newest first, by cursor
//	GET  /healthz            liveness, unauthenticated
func (s *Service) routes() http.Handler {
	protect := idem.New(s.db.store, &idem.Config{
		RequireKey:  true,
		GuardConfig: idem.GuardConfig{Transactional: true, TTL: s.cfg.KeyTTL, Lease: s.cfg.KeyLease, StoreTimeout: s.cfg.StoreTimeout, Metrics: s.cfg.Metrics, Logger: s.log, Clock: clockOf(s.cfg.Now), Keyring: s.cfg.Keyring, EncryptionRequired: s.cfg.EncryptionRequired, MinKeyLength: s.cfg.MinKeyLength, MaxInProgressPerScope: s.cfg.MaxInProgressPerScope, NewKeysPerSecondPerScope: s.cfg.NewKeysPerSecondPerScope},

		Scope: func(r *http.Request) (string, error) {
			if t := tenantFrom(r.Context()); t != "" {
				return t, nil
			}
			return "", errors.New("no tenant")
		},

		BodyTimeout: s.cfg.BodyTimeout,
	})
	api := http.NewServeMux()
	api.Handle("POST /v1/payments", s.afterCommit(protect(http.HandlerFunc(s.create))))
	api.HandleFunc("GET /v1/payments/{id}", s.get)
	api.HandleFunc("GET /v1/payments", s.list)
	api.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, &problem{Status: http.StatusNotFound, Code: codeNotFound, Title: "Not found",
			Detail: "No such resource: the API has POST /v1/payments, GET /v1/payments and GET /v1/payments/{id}."})
	})
	mux := http.NewServeMux()
	mux.Handle("/v1/", s.authenticate(api))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	return mux
}

type tenantKey struct{}

func tenantFrom(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// authenticate maps the bearer token to its tenant, or answers 401 before
// anything else happens: an unauthenticated request never reaches the store.
func (s *Service) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := ""
		if scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
			tenant = s.tokens[sha256.Sum256([]byte(strings.TrimSpace(token)))]
		}
		if tenant == "" || len(r.Header.Values("Authorization")) > 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem-payments"`)
			writeProblem(w, &problem{Status: http.StatusUnauthorized, Code: codeUnauthorized, Title: "Unauthorized",
				Detail: "Send Authorization: Bearer TOKEN with a token of your tenant."})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

// afterCommit watches the answers of the protected create route: a fresh
// 201 means the payment committed (the middleware commits before it sends
// the answer), so the relays are woken. It is also the after_commit crash
// point.
func (s *Service) afterCommit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &commitWatcher{ResponseWriter: w, s: s}
		next.ServeHTTP(cw, r)
		if cw.created {
			s.notifyRelays()
		}
	})
}

type commitWatcher struct {
	http.ResponseWriter
	s       *Service
	created bool
	wrote   bool
}

func (cw *commitWatcher) WriteHeader(status int) {
	if !cw.wrote {
		cw.wrote = true
		if status == http.StatusCreated && cw.Header().Get(idem.HeaderReplayed) == "" {
			cw.created = true
			cw.s.crash(CrashAfterCommit)
		}
	}
	cw.ResponseWriter.WriteHeader(status)
}

func (cw *commitWatcher) Write(b []byte) (int, error) {
	if !cw.wrote {
		cw.WriteHeader(http.StatusOK)
	}
	return cw.ResponseWriter.Write(b)
}

func (cw *commitWatcher) Unwrap() http.ResponseWriter { return cw.ResponseWriter }

// create runs under the idem middleware in transactional mode: the key is
// reserved, and the payment, its outbox row and the key's completion commit
// together when this handler answers 2xx or 4xx.
func (s *Service) create(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	s.crash(CrashAfterReserve)
	req, prob := decodeCreate(r)
	if prob != nil {
		// Rejected before any effect: the key is dropped, so the corrected
		// request may reuse it.
		idem.Reject(ctx)
		writeProblem(w, prob)
		return
	}
	tenant := tenantFrom(ctx)
	key, _ := idem.KeyFromContext(ctx)
	tx, err := idemstore.TxFromContext(ctx)
	if err != nil {
		s.internalError(w, "beginning the transaction", err)
		return
	}
	// The payments table keeps (tenant, key) unique beyond the key's
	// retention: a retry that arrives after the record expired finds the
	// payment instead of making a second one.
	existing, err := s.db.repo.byKeyTx(ctx, tx, tenant, key)
	switch {
	case err == nil:
		if existing.CustomerID != req.CustomerID || existing.AmountCents != req.AmountCents || existing.Currency != req.Currency {
			idem.Reject(ctx)
			writeProblem(w, &problem{Status: http.StatusUnprocessableEntity, Code: idem.CodeKeyReused,
				Title:  "Idempotency-Key reused with another request",
				Detail: "This Idempotency-Key was already used for another payment."})
			return
		}
		w.Header().Set("Location", "/v1/payments/"+existing.ID)
		writeJSON(w, http.StatusOK, existing)
		return
	case !errors.Is(err, errNotFound):
		s.internalError(w, "looking up the key's payment", err)
		return
	}
	p := &Payment{
		ID:          newPaymentID(),
		Status:      StatusPending,
		CustomerID:  req.CustomerID,
		AmountCents: req.AmountCents,
		Currency:    req.Currency,
		CreatedAt:   s.now(),
		tenant:      tenant,
		providerKey: idem.DerivedKeyFromContext(ctx, "charge"),
	}
	payload, err := json.Marshal(chargeMessage{PaymentID: p.ID})
	if err != nil {
		s.internalError(w, "encoding the outbox message", err)
		return
	}
	p.outboxID, err = s.db.repo.enqueueTx(ctx, tx, s.db.outbox, outbox.Message{
		Topic: topicCharge, Payload: payload, IdempotencyKey: p.providerKey,
	})
	if err != nil {
		s.internalError(w, "enqueueing the charge", err)
		return
	}
	if err := s.db.repo.insertTx(ctx, tx, p, key); err != nil {
		s.internalError(w, "inserting the payment", err)
		return
	}
	s.log.Info("payments: payment created", "payment_id", p.ID, "tenant", tenant,
		"amount_cents", p.AmountCents, "currency", p.Currency)
	w.Header().Set("Location", "/v1/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

// internalError answers 500, which rolls the transaction back and releases
// the key: the request had no effect and may be retried.
func (s *Service) internalError(w http.ResponseWriter, op string, err error) {
	s.log.Error("payments: "+op+" failed", "error", err)
	writeProblem(w, &problem{Status: http.StatusInternalServerError, Code: codeInternal, Title: "Internal error",
		Detail: "The payment could not be recorded and nothing was done. Retry with the same Idempotency-Key."})
}

func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	p, err := s.db.repo.get(r.Context(), tenantFrom(r.Context()), r.PathValue("id"))
	switch {
	case errors.Is(err, errNotFound):
		// Another tenant's payment is not found either.
		writeProblem(w, &problem{Status: http.StatusNotFound, Code: codeNotFound, Title: "Not found",
			Detail: "No payment of yours has this id."})
	case err != nil:
		s.unavailable(w, "reading a payment", err)
	default:
		writeJSON(w, http.StatusOK, p)
	}
}

// listPage is the answer of GET /v1/payments.
type listPage struct {
	Data    []*Payment `json:"data"`
	HasMore bool       `json:"has_more"`
	// NextCursor, when HasMore, fetches the next page: ?cursor=NEXT.
	NextCursor string `json:"next_cursor,omitempty"`
}

func (s *Service) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := defaultPageSize
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageSize {
			writeProblem(w, &problem{Status: http.StatusBadRequest, Code: codeInvalidQuery, Title: "Invalid query",
				Detail: "limit must be an integer from 1 to " + strconv.Itoa(maxPageSize) + "."})
			return
		}
		limit = n
	}
	before := int64(math.MaxInt64)
	if v := q.Get("cursor"); v != "" {
		seq, ok := decodeCursor(v)
		if !ok {
			writeProblem(w, &problem{Status: http.StatusBadRequest, Code: codeInvalidQuery, Title: "Invalid query",
				Detail: "cursor must be the next_cursor of an earlier page."})
			return
		}
		before = seq
	}
	ps, err := s.db.repo.list(r.Context(), tenantFrom(r.Context()), before, limit+1)
	if err != nil {
		s.unavailable(w, "listing payments", err)
		return
	}
	page := listPage{Data: ps}
	if len(ps) > limit {
		page.Data = ps[:limit]
		page.HasMore = true
		page.NextCursor = encodeCursor(ps[limit-1].seq)
	}
	if page.Data == nil {
		page.Data = []*Payment{}
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *Service) unavailable(w http.ResponseWriter, op string, err error) {
	s.log.Error("payments: "+op+" failed", "error", err)
	w.Header().Set("Retry-After", "1")
	writeProblem(w, &problem{Status: http.StatusServiceUnavailable, Code: idem.CodeStoreUnavailable,
		Title: "Store unavailable", Detail: "The payments could not be read. Retry later."})
}

// encodeCursor and decodeCursor make a page's position opaque to clients.
func encodeCursor(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("p" + strconv.FormatInt(seq, 10)))
}

func decodeCursor(c string) (int64, bool) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) < 2 || b[0] != 'p' {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b[1:]), 10, 64)
	return n, err == nil && n > 0
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, &problem{Status: http.StatusInternalServerError, Code: codeInternal, Title: "Internal error"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeProblem answers an RFC 9457 problem. Its detail never carries a key,
// a token or the body.
func writeProblem(w http.ResponseWriter, p *problem) {
	title := p.Title
	if title == "" {
		title = http.StatusText(p.Status)
	}
	body := struct {
		Type          string         `json:"type"`
		Title         string         `json:"title"`
		Status        int            `json:"status"`
		Detail        string         `json:"detail,omitempty"`
		Code          string         `json:"code"`
		InvalidParams []invalidParam `json:"invalid-params,omitempty"`
	}{problemTypeBase + p.Code, title, p.Status, p.Detail, p.Code, p.InvalidParams}
	b, _ := json.Marshal(body)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	w.Write(append(b, '\n'))
}
