package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/outbox"
)

// charge is the part of the provider's charge the service keeps.
type charge struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key"`
	AmountCents    int64  `json:"amount_cents"`
	Currency       string `json:"currency"`
}

// providerClient calls the payment provider (cmd/idem/internal/provider, or any
// server with the same API).
type providerClient struct {
	base   string // without a trailing slash
	client *http.Client
}

// maxProviderAnswer bounds the answers read from the provider.
const maxProviderAnswer = 1 << 20

// charge asks the provider to charge p with its derived key. The outcome
// follows outbox.HTTPOutcome, except that a 2xx without a charge in its body
// is unknown: the provider may have charged.
func (c *providerClient) charge(ctx context.Context, p *Payment) (*charge, outbox.Outcome, error) {
	body, err := json.Marshal(map[string]any{
		"amount_cents": p.AmountCents,
		"currency":     p.Currency,
		"reference":    p.ID,
	})
	if err != nil {
		return nil, outbox.OutcomePermanent, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/charges", bytes.NewReader(body))
	if err != nil {
		return nil, outbox.OutcomePermanent, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, p.providerKey)
	resp, err := c.client.Do(req)
	if err != nil || resp.StatusCode < 200 || resp.StatusCode > 299 {
		outcome, err := outbox.HTTPOutcome(resp, err)
		return nil, outcome, err
	}
	defer resp.Body.Close()
	ch, err := decodeCharge(resp, p.providerKey)
	if err != nil {
		return nil, outbox.OutcomeUnknown, fmt.Errorf("the provider answered %s without a readable charge: %w", resp.Status, err)
	}
	return ch, outbox.OutcomeDelivered, nil
}

// errLookup is wrapped by the errors of lookup when the provider's answer
// says neither "charged" nor "not charged".
var errLookup = errors.New("the provider's ledger could not be read")

// lookup asks the provider for the charge made with key: the charge, or
// found false when the provider says it has none (404 with problem code
// no-charge). Any other answer is an error, never "not found": a wrong URL
// must not fail a payment that was charged.
func (c *providerClient) lookup(ctx context.Context, key string) (*charge, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/charges?idempotency_key="+url.QueryEscape(key), nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", errLookup, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		ch, err := decodeCharge(resp, key)
		if err != nil {
			return nil, false, fmt.Errorf("%w: %w", errLookup, err)
		}
		return ch, true, nil
	case resp.StatusCode == http.StatusNotFound && problemCode(resp) == "no-charge":
		return nil, false, nil
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxProviderAnswer))
	return nil, false, fmt.Errorf("%w: it answered %s", errLookup, resp.Status)
}

// decodeCharge reads a charge and checks that it was made with key.
func decodeCharge(resp *http.Response, key string) (*charge, error) {
	var ch charge
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxProviderAnswer)).Decode(&ch); err != nil {
		return nil, err
	}
	if ch.ID == "" {
		return nil, errors.New("the charge has no id")
	}
	if ch.IdempotencyKey != key {
		return nil, errors.New("the charge was made with another idempotency key")
	}
	return &ch, nil
}

// problemCode returns the "code" member of a problem+json answer.
func problemCode(resp *http.Response) string {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/problem+json" {
		return ""
	}
	var p struct {
		Code string `json:"code"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&p) != nil {
		return ""
	}
	return p.Code
}

// trimBase returns a base URL without its trailing slashes.
func trimBase(u string) string { return strings.TrimRight(u, "/") }
