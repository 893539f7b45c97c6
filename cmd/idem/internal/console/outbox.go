package console

import (
	"context"
	"errors"
	"time"
)

// Outbox is what the console needs of the transactional outbox: list the
// messages in one state, count them, and make a dead message pending again.
// The command adapts the outbox package's stores to it.
type Outbox interface {
	// MessageList returns at most p.Limit messages in state p.State
	// ("pending", "done" or "dead") with an ID greater than p.AfterID,
	// ordered by ID.
	MessageList(ctx context.Context, p *OutboxListParams) ([]*OutboxMessage, error)
	// MessageCounts returns the number of messages in each state.
	MessageCounts(ctx context.Context) (map[string]int, error)
	// MessageRedrive makes the dead message id pending again with a fresh
	// attempt budget. It returns an error matching ErrNoDeadMessage when no
	// dead message has that id.
	MessageRedrive(ctx context.Context, id int64) error
}

// ErrNoDeadMessage is returned (wrapped or not) by Outbox.MessageRedrive when
// no dead message has the id.
var ErrNoDeadMessage = errors.New("console: no dead outbox message with this id")

// OutboxListParams filter Outbox.MessageList.
type OutboxListParams struct {
	State   string
	AfterID int64
	Limit   int
}

// OutboxMessage is one outbox row as the console shows it.
type OutboxMessage struct {
	ID    int64
	Topic string
	// IdempotencyKey is the key the downstream deduplicates on.
	IdempotencyKey string
	State          string
	Attempts       int
	AvailableAt    time.Time
	LastError      string
	Payload        []byte
	CreatedAt      time.Time
	UpdatedAt      time.Time
}
