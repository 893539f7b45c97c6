package payments

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"
)

// Status is the state of a payment.
type Status string

// The states of a payment: pending until the provider answers, then
// succeeded or failed. requires_reconciliation marks a payment whose charge
// had an unknown outcome (a timeout, a dropped connection) that the
// reconciler has not settled yet; it ends succeeded or failed too.
const (
	StatusPending                Status = "pending"
	StatusSucceeded              Status = "succeeded"
	StatusFailed                 Status = "failed"
	StatusRequiresReconciliation Status = "requires_reconciliation"
)

// Payment is one payment as the API shows it.
type Payment struct {
	ID          string    `json:"id"`
	Status      Status    `json:"status"`
	CustomerID  string    `json:"customer_id"`
	AmountCents int64     `json:"amount_cents"`
	Currency    string    `json:"currency"`
	CreatedAt   time.Time `json:"created_at"`
	// ChargeID is the provider's charge, once the payment succeeded.
	ChargeID string `json:"charge_id,omitempty"`
	// FailureReason says why a failed payment failed.
	FailureReason string `json:"failure_reason,omitempty"`

	// Internal columns, never shown.
	seq               int64
	tenant            string
	providerKey       string
	outboxID          int64
	reconcileAttempts int
	updatedAt         time.Time
}

// settled reports whether the payment reached a final state.
func (p *Payment) settled() bool {
	return p.Status == StatusSucceeded || p.Status == StatusFailed
}

// errNotFound is returned by the repository's lookups when nothing matches.
var errNotFound = errors.New("payments: payment not found")

// newPaymentID returns a new random payment id, "pay_" and 24 hex digits.
func newPaymentID() string {
	var b [12]byte
	rand.Read(b[:])
	return "pay_" + hex.EncodeToString(b[:])
}
