package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// State is the lifecycle state of an outbox message.
type State string

const (
	// StatePending means the message waits for delivery (or is being
	// delivered, while its claim lasts).
	StatePending State = "pending"
	// StateDone means the downstream accepted the message.
	StateDone State = "done"
	// StateDead means delivery was given up: a permanent failure, or
	// MaxAttempts failed attempts. An operator may redrive it.
	StateDead State = "dead"
)

// Message is one row of the outbox.
type Message struct {
	// ID is assigned by Enqueue.
	ID int64
	// Topic names the downstream operation, e.g. "provider.charge".
	Topic string
	// Payload is the operation's JSON document. PostgreSQL stores it as
	// jsonb, which normalises whitespace and key order.
	Payload json.RawMessage
	// IdempotencyKey is the key the downstream deduplicates on; every
	// delivery attempt of the message sends it unchanged. Topic and key are
	// unique together.
	IdempotencyKey string
	// State is the message's state.
	State State
	// Attempts counts the delivery attempts started, including the one in
	// progress while the message is claimed.
	Attempts int
	// AvailableAt is when the message is due. Enqueue defaults it to now.
	AvailableAt time.Time
	// ClaimedUntil is the end of the current claim; zero when unclaimed.
	ClaimedUntil time.Time
	// LastError is the error of the last failed attempt.
	LastError string
	// CreatedAt and UpdatedAt are set by the store.
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Limits on Message fields, also enforced by CHECK constraints.
const (
	MaxTopicLength = 255
	MaxKeyLength   = 255
)

// validate checks the fields Enqueue writes.
func (m *Message) validate() error {
	switch {
	case m.Topic == "" || len(m.Topic) > MaxTopicLength:
		return fmt.Errorf("%w: the topic must have 1 to %d bytes", ErrInvalidMessage, MaxTopicLength)
	case m.IdempotencyKey == "" || len(m.IdempotencyKey) > MaxKeyLength:
		return fmt.Errorf("%w: the idempotency key must have 1 to %d bytes", ErrInvalidMessage, MaxKeyLength)
	case !json.Valid(m.Payload):
		return fmt.Errorf("%w: the payload is not JSON", ErrInvalidMessage)
	}
	return nil
}

// ClaimParams are the inputs of Store.MessageClaim.
type ClaimParams struct {
	// Limit bounds the batch. Defaults to 100 when zero.
	Limit int
	// Now is the time due rows are compared with. Defaults to the store's
	// clock when zero.
	Now time.Time
	// ClaimedUntil ends the claim: a relay that has not recorded an outcome
	// by then is presumed dead and another may claim the message.
	ClaimedUntil time.Time
}

// FinishParams are the inputs of Store.MessageFinish.
type FinishParams struct {
	// ID names the message.
	ID int64
	// Attempt is the message's Attempts as claimed: it fences the write.
	Attempt int
	// State is the new state: StatePending (retry at AvailableAt),
	// StateDone or StateDead.
	State State
	// AvailableAt is when a pending message is due again. Defaults to Now
	// when zero.
	AvailableAt time.Time
	// LastError is stored as the message's last error; empty clears it.
	LastError string
	// Now stamps updated_at. Defaults to the store's clock when zero.
	Now time.Time
}

// UnclaimParams are the inputs of Store.MessageUnclaim.
type UnclaimParams struct {
	// ID names the message.
	ID int64
	// Attempt is the message's Attempts as claimed: it fences the write.
	Attempt int
	// Now stamps updated_at. Defaults to the store's clock when zero.
	Now time.Time
}

// PruneParams are the inputs of Store.MessagePrune.
type PruneParams struct {
	// Before deletes done messages last updated strictly before it.
	Before time.Time
	// Limit bounds the batch. Defaults to 1000 when zero.
	Limit int
}

// ListParams filter Store.MessageList.
type ListParams struct {
	// State keeps the messages in this state; empty keeps all.
	State State
	// AfterID is a cursor: the ID of the last message of the previous page.
	AfterID int64
	// Limit bounds the page. Defaults to 100 when zero.
	Limit int
}

// Default batch and page sizes.
const (
	defaultClaimLimit = 100
	defaultPruneLimit = 1000
	defaultListLimit  = 100
)

// Store is what the Relay and operators need from an outbox table.
// SQLiteStore and PgxStore implement it; each also has a typed Enqueue that
// writes inside the caller's transaction.
type Store interface {
	// MessageClaim claims at most p.Limit pending messages that are due and
	// not claimed (or whose claim expired) until p.ClaimedUntil, counts an
	// attempt on each, and returns them in due order. Concurrent callers
	// claim disjoint messages.
	MessageClaim(ctx context.Context, p *ClaimParams) ([]*Message, error)
	// MessageFinish records the outcome of a claimed attempt and ends the
	// claim. It returns ErrClaimLost when the message is not claimed by
	// p.Attempt any more.
	MessageFinish(ctx context.Context, p *FinishParams) error
	// MessageUnclaim hands back a claimed message that was not attempted and
	// uncounts the attempt. It returns ErrClaimLost like MessageFinish.
	MessageUnclaim(ctx context.Context, p *UnclaimParams) error
	// MessageGet returns the message or ErrNotFound.
	MessageGet(ctx context.Context, id int64) (*Message, error)
	// MessageList returns at most p.Limit messages in state p.State with an
	// ID above p.AfterID, in ID order: a page for operators.
	MessageList(ctx context.Context, p *ListParams) ([]*Message, error)
	// MessageRedrive makes a dead message pending and due now, with its
	// attempt count reset. It returns ErrNotFound when no dead message has
	// the id.
	MessageRedrive(ctx context.Context, id int64) error
	// MessagePrune deletes done messages older than p.Before, at most
	// p.Limit of them, and returns how many it deleted.
	MessagePrune(ctx context.Context, p *PruneParams) (int, error)
	// MessageCounts returns the number of messages in each state.
	MessageCounts(ctx context.Context) (map[State]int, error)
}

// Config configures a store. A nil *Config means all defaults.
type Config struct {
	// Now is the store's clock: Enqueue's created_at and default
	// available_at, and the time of params whose Now is zero. Defaults to
	// time.Now.
	Now func() time.Time
	// Schema is the PostgreSQL schema of PgxStore's tables; Migrate creates
	// it when it is missing. Defaults to "": the first schema of the
	// connection's search_path. SQLiteStore ignores it.
	Schema string
}

func (c *Config) withDefaults() Config {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

// micro truncates t to the microsecond precision both databases keep, in UTC.
func micro(t time.Time) time.Time {
	return time.UnixMicro(t.UnixMicro()).UTC()
}

// orNow returns t, or now() when t is zero, at microsecond precision.
func orNow(t time.Time, now func() time.Time) time.Time {
	if t.IsZero() {
		return micro(now())
	}
	return micro(t)
}

// check checks the state MessageFinish may write.
func (p *FinishParams) check() error {
	switch p.State {
	case StatePending, StateDone, StateDead:
		return nil
	}
	return fmt.Errorf("outbox: finishing message %d: invalid state %q", p.ID, p.State)
}

// sortDue sorts claimed messages in due order: by AvailableAt, then ID.
func sortDue(msgs []*Message) {
	slices.SortFunc(msgs, func(a, b *Message) int {
		if c := a.AvailableAt.Compare(b.AvailableAt); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
}
